// NpcTown.cs: the NPC sample's game logic, free of Unity (NpcDialogue.cs drives it from a
// MonoBehaviour; tests/test_csharp.py runs it under Mono). As bindings/examples/cpp_npc:
//   - the world's description (a shared persona) is evaluated once, and each NPC's session is
//     forked from it, sharing its KV cache blocks;
//   - an NPC hears the last line, says one of its own (streamed), then acts: a call to one of the
//     game's functions (move_to, give_item, say), sampled under the tools' grammar so that it always
//     parses and its arguments fit the function's schema;
//   - an NPC can be saved to a file and freed (the player left), and restored where it was.
// Every generation runs on a worker thread (Session.GenerateAsync), so a game's main thread only
// awaits.
using System;
using System.Collections.Generic;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using FastLLM;

namespace FastLLM.Samples
{
    /// <summary>What an NPC did in a turn.</summary>
    public sealed class NpcTurn
    {
        public string Npc;
        public string Line;       // what it said
        public string CallJson;   // the library's parse of its action: {"format", "content", "tool_calls"}
        public string Function;   // the function it called (null: none)
        public string Arguments;  // its arguments as a JSON object
    }

    public sealed class NpcTown : IDisposable
    {
        public const string World =
            "Once upon a time, there was a small town with a castle. At the gate stood a guard, in the square a " +
            "merchant sold apples from a cart, and by the river a smith made swords. Every day they talked.";

        // The game's functions, as OpenAI's tools; the game runs the call it gets back.
        public const string Tools = @"[
  {""type"": ""function"", ""function"": {""name"": ""move_to"", ""description"": ""Walk to a place in town."",
    ""parameters"": {""type"": ""object"", ""additionalProperties"": false, ""required"": [""place""],
      ""properties"": {""place"": {""enum"": [""gate"", ""square"", ""river"", ""castle""]}}}}},
  {""type"": ""function"", ""function"": {""name"": ""give_item"", ""description"": ""Give an item to someone."",
    ""parameters"": {""type"": ""object"", ""additionalProperties"": false, ""required"": [""item"", ""to""],
      ""properties"": {""item"": {""enum"": [""apple"", ""sword"", ""coin""]},
                     ""to"": {""enum"": [""Guard"", ""Merchant"", ""Smith"", ""player""]}}}}},
  {""type"": ""function"", ""function"": {""name"": ""say"", ""description"": ""Shout a short word."",
    ""parameters"": {""type"": ""object"", ""additionalProperties"": false, ""required"": [""word""],
      ""properties"": {""word"": {""enum"": [""hello"", ""halt"", ""bargain"", ""farewell""]}}}}}
]";

        private sealed class Npc
        {
            public string Name;
            public Session Session;   // null while saved
            public string Pending;    // text it has not seen yet: its intro, then what it hears
            public ulong Seed;
        }

        private readonly Model model_;
        private readonly Session world_;
        private readonly string grammar_;
        private readonly List<Npc> npcs_ = new List<Npc>();
        private string lastLine_ = "";

        public NpcTown(Model model)
        {
            model_ = model;
            world_ = model.CreateSession();
            world_.Eval(model.Tokenize(World), LogitsMode.None);  // the persona, evaluated once for all
            // The calls' format is the one the model's chat template teaches (the generic JSON object
            // for a model without one).
            grammar_ = model.ToolCallGrammar(Tools);
            Add("Guard", "The guard was grumpy.", 1);
            Add("Merchant", "The merchant was cheerful.", 100);
            Add("Smith", "The smith was tired.", 200);
        }

        private void Add(string name, string intro, ulong seed)
        {
            npcs_.Add(new Npc { Name = name, Session = world_.Fork(), Pending = " " + intro, Seed = seed });
        }

        public int Count { get { return npcs_.Count; } }
        public string NameOf(int i) { return npcs_[i].Name; }
        public bool IsSaved(int i) { return npcs_[i].Session == null; }
        public int WorldTokens { get { return world_.TokenCount; } }
        public SessionMemory MemoryOf(int i) { return npcs_[i].Session.Memory; }

        /// <summary>NPC i hears the last line, says its own (onPiece gets it piece by piece, on the
        /// worker thread), then acts.</summary>
        public async Task<NpcTurn> TakeTurnAsync(int i, int maxTokens, Action<string> onPiece = null,
                                                 CancellationToken cancellation = default(CancellationToken))
        {
            var npc = npcs_[i];
            if (npc.Session == null) throw new InvalidOperationException(npc.Name + " is saved: Restore it first");
            if (lastLine_.Length > 0) npc.Pending += " " + lastLine_;
            var line = new GenerateOptions { Temperature = 0.7f, Seed = npc.Seed++, MaxNewTokens = maxTokens, Stop = new[] { "\n" } };
            var said = await npc.Session.GenerateAsync(npc.Pending + "\n" + npc.Name + " said:", line, onPiece, cancellation);
            npc.Pending = "";
            // Room for the longest call, so that it always ends: every value is an enum, so a call is a
            // few fixed strings plus at most 9 whitespace runs of 21 bytes, and a token is a byte or more.
            var act = new GenerateOptions { Temperature = 0.7f, Seed = npc.Seed++, MaxNewTokens = 320, Grammar = grammar_ };
            var call = await npc.Session.GenerateAsync("\n" + npc.Name + " does:", act, null, cancellation);
            lastLine_ = said.Text.Trim();
            var turn = new NpcTurn { Npc = npc.Name, Line = said.Text, CallJson = model_.ParseToolCalls(call.Text, Tools) };
            ReadCall(turn);
            return turn;
        }

        /// <summary>Saves NPC i's conversation to a file and frees its session (as a game does when
        /// the player leaves).</summary>
        public void Save(int i, string path)
        {
            npcs_[i].Session.SaveStateFile(path);
            npcs_[i].Session.Dispose();
            npcs_[i].Session = null;
        }

        public void Restore(int i, string path)
        {
            var s = model_.CreateSession();
            s.LoadStateFile(path);
            npcs_[i].Session = s;
        }

        // The first call of the library's JSON, {"format":..,"content":..,"tool_calls":[{"name":"..",
        // "arguments":"{..}"}]}: its name, and its arguments unquoted (a game would use its JSON
        // library; .NET Standard 2.0 has none).
        private static void ReadCall(NpcTurn turn)
        {
            const string Key = "\"tool_calls\":[{\"name\":\"";
            var json = turn.CallJson;
            int at = json.IndexOf(Key, StringComparison.Ordinal);
            if (at < 0) return;
            int nameAt = at + Key.Length, nameEnd = json.IndexOf('"', nameAt);
            turn.Function = json.Substring(nameAt, nameEnd - nameAt);
            int argsAt = json.IndexOf("\"arguments\":\"", nameEnd, StringComparison.Ordinal) + 13;
            var args = new StringBuilder();
            for (int k = argsAt; k < json.Length && json[k] != '"'; k++)
            {
                if (json[k] == '\\' && k + 1 < json.Length) k++;
                args.Append(json[k]);
            }
            turn.Arguments = args.ToString();
        }

        public void Dispose()
        {
            foreach (var npc in npcs_) if (npc.Session != null) npc.Session.Dispose();
            world_.Dispose();
        }
    }
}
