// Tests.cs: the C# binding against a real model, under Mono (run by tests/test_csharp.py).
// Usage: mono FastLLMTests.exe STORIES.flm SMOLLM.flm OUT_DIR [test ...]
// Prints "ok NAME" or "FAIL NAME: why" per test (exit code 1 if any failed) and writes what a
// reference outside this program checks (the golden text, a JSON action for jsonschema, a rendered
// template for jinja2, the struct layouts for the C compiler) to OUT_DIR/NAME.txt.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using FastLLM;
using FastLLM.Samples;

static class Tests
{
    static string stories_, smollm_, out_;
    const string Prompt = "Once upon a time";

    static int Main(string[] args)
    {
        stories_ = args[0];
        smollm_ = args[1];
        out_ = args[2];
        var only = new HashSet<string>(args.Skip(3));
        int failed = 0;
        // Test*: the suite; Alone*: run only when named (they need a particular environment)
        foreach (var m in typeof(Tests).GetMethods(BindingFlags.Static | BindingFlags.NonPublic)
                                       .Where(m => m.Name.StartsWith("Test") || m.Name.StartsWith("Alone")))
        {
            var name = m.Name.Substring(m.Name.StartsWith("Test") ? 4 : 5);
            if (only.Count > 0 ? !only.Contains(name) : m.Name.StartsWith("Alone")) continue;
            var sw = Stopwatch.StartNew();
            try
            {
                m.Invoke(null, null);
                Console.WriteLine("ok " + name + " (" + sw.ElapsedMilliseconds + " ms)");
            }
            catch (TargetInvocationException e)
            {
                failed++;
                Console.WriteLine("FAIL " + name + ": " + e.InnerException.ToString().Replace("\n", "\n    "));
            }
        }
        return failed == 0 ? 0 : 1;
    }

    static void Check(bool cond, string what)
    {
        if (!cond) throw new Exception("check failed: " + what);
    }

    static void Equal<T>(T want, T got, string what)
    {
        if (!EqualityComparer<T>.Default.Equals(want, got)) throw new Exception(what + ": want <" + want + ">, got <" + got + ">");
    }

    static void Write(string name, string text) { File.WriteAllText(Path.Combine(out_, name + ".txt"), text); }

    static FastLLMException Throws(Action a, Status status, string contains = null)
    {
        try
        {
            a();
        }
        catch (FastLLMException e)
        {
            Equal(status, e.Status, "status of " + e.Message);
            if (contains != null) Check(e.Message.Contains(contains), "'" + contains + "' in '" + e.Message + "'");
            return e;
        }
        throw new Exception("no FastLLMException (" + status + ")");
    }

    static Model Stories() { return new Model(stories_, new ModelParams { Threads = 2 }); }

    static GenerateOptions Greedy(int n) { return new GenerateOptions { MaxNewTokens = n, Temperature = 0 }; }

    // -- the raw layer ----------------------------------------------------------------------------

    // Sizes and offsets of every struct, for the test to compare with the header's.
    static void TestLayout()
    {
        var sb = new StringBuilder();
        foreach (var t in typeof(Native).GetNestedTypes().Where(t => t.IsValueType && t.Name.StartsWith("fastllm_")))
        {
            sb.Append(t.Name).Append(' ').Append(Marshal.SizeOf(t));
            foreach (var f in t.GetFields()) sb.Append(' ').Append(f.Name).Append('=').Append(Marshal.OffsetOf(t, f.Name));
            sb.Append('\n');
        }
        Write("Layout", sb.ToString());
    }

    static void TestVersionAndAbi()
    {
        Equal(Native.AbiVersion, Library.AbiVersion, "ABI version");
        Write("VersionAndAbi", Library.Version + "\n" + Library.Isa);
        // the check a library of another ABI version meets at load
        var check = typeof(Library).GetMethod("CheckAbi", BindingFlags.Static | BindingFlags.NonPublic);
        try
        {
            check.Invoke(null, new object[] { Native.AbiVersion + 1 });
            throw new Exception("a wrong ABI version passed");
        }
        catch (TargetInvocationException e)
        {
            var f = (FastLLMException)e.InnerException;
            Equal(Status.Unsupported, f.Status, "status");
            Check(f.Message.Contains("ABI version " + (Native.AbiVersion + 1)), f.Message);
        }
    }

    // -- generation -------------------------------------------------------------------------------

    static void TestGoldenGreedy()
    {
        using (var model = Stories())
        using (var s = model.CreateSession())
        {
            Write("GoldenGreedy", Prompt + s.Generate(Prompt, 40, 0f));
        }
    }

    // The same greedy text from the callback, the IEnumerable, the async stream and GenerateAsync.
    static void TestStreamingPiecesEqualTheText()
    {
        using (var model = Stories())
        {
            string whole;
            using (var s = model.CreateSession()) whole = s.Generate(Prompt, 40, 0f);
            var pieces = new List<string>();
            GenerationResult r;
            using (var s = model.CreateSession()) r = s.Generate(Prompt, Greedy(40), pieces.Add);
            Equal(whole, r.Text, "callback result");
            Equal(whole, string.Concat(pieces), "callback pieces");
            Check(pieces.Count > 5, "pieces arrive one by one");
            Equal(40, r.GeneratedTokens, "generated tokens");
            Equal(StopReason.MaxTokens, r.StopReason, "stop reason");

            List<string> streamed;
            using (var s = model.CreateSession()) streamed = s.Stream(Prompt, Greedy(40)).ToList();
            Equal(whole, string.Concat(streamed), "IEnumerable pieces");
            using (var s = model.CreateSession())
            {
                // leaving the enumeration early ends the generation; the session is usable again
                var first = s.Stream(Prompt, Greedy(40)).Take(3).ToList();
                Equal(3, first.Count, "three pieces");
                Check(Native.fastllm_session_is_generating(s.Handle) == 0, "generation ended");
                Check(s.Generate(" The end.", 4, 0f) != null, "usable after");
            }

            int main = Thread.CurrentThread.ManagedThreadId, worker = main;
            using (var s = model.CreateSession())
            using (var stream = s.GenerateStreamAsync(Prompt, new GenerateOptions { MaxNewTokens = 40, Temperature = 0 }))
            {
                var got = new StringBuilder();
                while (stream.MoveNextAsync().Result) got.Append(stream.Current);
                Equal(whole, got.ToString(), "async stream pieces");
                Equal(whole, stream.Result.Result.Text, "async stream result");
                var r2 = s.GenerateAsync(" And", Greedy(5), p => worker = Thread.CurrentThread.ManagedThreadId).Result;
                Check(worker != main, "GenerateAsync runs on another thread");
                Equal(5, r2.GeneratedTokens, "async tokens");
            }
        }
    }

    static void TestEvalLogits()
    {
        using (var model = Stories())
        using (var s = model.CreateSession())
        {
            var ids = model.Tokenize(Prompt);
            var logits = s.Eval(ids);
            Equal(model.Info.VocabSize, logits.Length, "logits");
            int best = 0;
            for (int i = 1; i < logits.Length; i++) if (logits[i] > logits[best]) best = i;
            string next;
            using (var g = model.CreateSession()) next = g.Generate(Prompt, 1, 0f);
            Equal(next, model.Detokenize(new[] { best }).Length == 0 ? next : Encoding.UTF8.GetString(model.TokenToPiece(best)), "argmax is the greedy token");
            Equal(ids.Length, s.TokenCount, "tokens");
            Check(ids.SequenceEqual(s.Tokens), "session tokens");
            var all = s.Eval(model.Tokenize(" there", false), LogitsMode.All);
            Equal(model.Tokenize(" there", false).Length * model.Info.VocabSize, all.Length, "all logits");
            Equal(model.Detokenize(model.Tokenize(Prompt, false)), Prompt, "detokenize");
        }
    }

    // Embeddings of a decoder (its last token), written for the test to compare with the Python
    // binding's; the poolings' shapes; reranking on a model without a classifier is refused.
    static void TestEmbeddings()
    {
        using (var model = Stories())
        {
            var texts = new[] { "Once upon a time", "The dog ran to the park.", "héllo" };
            var v = model.Embed(texts);
            Equal(texts.Length, v.Length, "vectors");
            foreach (var row in v)
            {
                Equal(model.Info.HiddenSize, row.Length, "dimension");
                Check(Math.Abs(Math.Sqrt(row.Sum(x => (double)x * x)) - 1) < 1e-5, "unit length");
            }
            Write("Embeddings", string.Join("\n", v.Select(r => string.Join(" ", r.Select(x => x.ToString("R", System.Globalization.CultureInfo.InvariantCulture))))));
            var perToken = model.Embed(new[] { texts[0] }, Pooling.None, normalize: false);
            Equal(model.Tokenize(texts[0]).Length, perToken.Length, "one vector per token");
            Throws(() => model.Embed(new string[0]), Status.InvalidArgument, "no inputs");
            Throws(() => model.Rerank("q", new[] { "d" }), Status.Unsupported, "cross-encoder");
        }
    }

    // A JSON action under a schema (checked by jsonschema in the test).
    static void TestJsonSchemaAction()
    {
        const string Schema = @"{""type"": ""object"", ""properties"": {""action"": {""enum"": [""attack"", ""flee"", ""talk""]},
            ""target"": {""type"": ""string"", ""maxLength"": 12}, ""times"": {""type"": ""integer"", ""minimum"": 1, ""maximum"": 3}},
            ""required"": [""action"", ""target"", ""times""]}";
        using (var model = Stories())
        using (var s = model.CreateSession())
        {
            var r = s.Generate("The knight decided", new GenerateOptions { JsonSchema = Schema, Temperature = 0.8f, Seed = 7, MaxNewTokens = 200 });
            Equal(StopReason.Grammar, r.StopReason, "the match completes");
            Write("JsonSchemaAction", Schema + "\u0001" + r.Text);
            Check(Library.JsonSchemaToGrammar(Schema).Contains("root"), "grammar");
        }
    }

    // LoRA adapters (run by tests/test_lora.py, which makes the adapter with peft and names it in
    // FASTLLM_TEST_ADAPTER): greedy tokens with it, at scale 0.5, and without, for the Python binding to
    // check; the adapter freed while a session applies it; bad input.
    static void AloneAdapters()
    {
        var path = Environment.GetEnvironmentVariable("FASTLLM_TEST_ADAPTER");
        using (var m = new Model(stories_))
        {
            var adapter = m.LoadAdapter(path);
            var lines = new List<string>();
            using (var s = m.CreateSession())
            {
                foreach (var scale in new[] { 1f, 0.5f, 0f })
                {
                    s.Reset();
                    if (scale == 0f) s.ClearAdapters();
                    else s.SetAdapter(adapter, scale);
                    s.Generate(Prompt, 12, 0f);
                    lines.Add(string.Join(",", s.Tokens));
                }
                s.Reset();
                s.SetAdapters(new Dictionary<Adapter, float> { { adapter, 1f } });
                adapter.Dispose();  // deferred: the session goes on with it
                s.Generate(Prompt, 12, 0f);
                Equal(lines[0], string.Join(",", s.Tokens), "after the adapter's Dispose");
                Throws(() => s.SetAdapter(adapter), Status.InvalidArgument, "disposed");
                var again = m.LoadAdapter(path);
                Throws(() => s.SetAdapter(again, float.NaN), Status.InvalidArgument, "not finite");
                Throws(() => s.SetAdapter(null), Status.InvalidArgument, "null");
                again.Dispose();
            }
            Throws(() => m.LoadAdapter(stories_), Status.BadFormat, "is a model");
            Throws(() => m.LoadAdapter(path + ".missing"), Status.IO);
            Write("Adapters", string.Join("\n", lines));
        }
    }

    // fork + save/load: the same continuation as never stopping, greedy and sampled.
    static void TestForkSaveLoadContinues()
    {
        using (var model = Stories())
        using (var persona = model.CreateSession())
        {
            persona.Eval(model.Tokenize("Once upon a time, there was a dragon."), LogitsMode.None);
            var sampled = new GenerateOptions { MaxNewTokens = 16, Temperature = 0.9f, Seed = 3 };
            string straight;
            using (var a = persona.Fork())
            {
                Check(a.Memory.KvSharedBytes > 0, "the fork shares the persona's blocks");
                straight = a.Generate(" The", Greedy(12)).Text + a.Generate(" Then", sampled).Text;
            }
            byte[] state;
            using (var b = persona.Fork())
            {
                var first = b.Generate(" The", Greedy(12)).Text;
                state = b.SaveState();
                var file = Path.Combine(out_, "fork.state");
                b.SaveStateFile(file);
                using (var c = model.CreateSession())
                {
                    c.LoadState(state);
                    Equal(b.TokenCount, c.TokenCount, "tokens restored");
                    Equal(straight, first + c.Generate(" Then", sampled).Text, "bytes");
                }
                using (var d = model.CreateSession())
                {
                    d.LoadStateFile(file);
                    Equal(straight, first + d.Generate(" Then", sampled).Text, "file");
                }
            }
            Equal(10, persona.Fork(10).TokenCount, "fork of a prefix");
        }
    }

    // A long prompt cancelled from another thread, through a CancellationToken and Session.Cancel.
    static void TestCancelStopsALongPrompt()
    {
        using (var model = new Model(smollm_, new ModelParams { Threads = 2 }))
        {
            var text = string.Concat(Enumerable.Repeat("The quick brown fox jumps over the lazy dog near the river bank. ", 220));
            var ids = model.Tokenize(text);
            var figures = new StringBuilder();
            for (int round = 0; round < 2; round++)
            {
                using (var s = model.CreateSession(new SessionParams { ContextLength = 4096, BatchSize = 64 }))
                using (var cts = new CancellationTokenSource())
                {
                    long cancelledAt = 0;
                    var sw = Stopwatch.StartNew();
                    var canceller = new Thread(() =>
                    {
                        Thread.Sleep(300);
                        cancelledAt = sw.ElapsedTicks;
                        if (round == 0) cts.Cancel();
                        else s.Cancel();
                    });
                    canceller.Start();
                    bool stopped = false;
                    try
                    {
                        if (round == 0) s.Generate(ids, Greedy(4), null, cts.Token);
                        else s.Eval(ids, LogitsMode.None);
                    }
                    catch (OperationCanceledException) { stopped = round == 0; }
                    catch (FastLLMException e) { stopped = round == 1 && e.Status == Status.Cancelled; }
                    long returnedAt = sw.ElapsedTicks;
                    canceller.Join();
                    Check(stopped, "round " + round + " stopped by its cancel");
                    double ms = (returnedAt - cancelledAt) * 1000.0 / Stopwatch.Frequency;
                    figures.AppendFormat("{0} {1:F1} ms after the cancel, {2} of {3} tokens kept\n",
                                         round == 0 ? "token" : "Cancel()", ms, s.TokenCount, ids.Length);
                    Check(s.TokenCount < ids.Length, "the rest of the prompt dropped");
                    Check(ms < 150, "returned " + ms + " ms after the cancel");
                }
            }
            // the async stream: cancelled after its first piece
            using (var s = model.CreateSession())
            using (var cts = new CancellationTokenSource())
            {
                var stream = s.GenerateStreamAsync("Hello", new GenerateOptions { MaxNewTokens = 200, IgnoreEos = true }, cts.Token);
                Check(stream.MoveNextAsync().Result, "a first piece");
                cts.Cancel();
                bool cancelled = false;
                try { while (stream.MoveNextAsync().Result) { } }
                catch (AggregateException e) { cancelled = e.InnerException is OperationCanceledException; }
                Check(cancelled, "the stream ends cancelled");
                Check(s.TokenCount < 100, "stopped early");
            }
            Write("CancelStopsALongPrompt", figures.ToString());
        }
    }

    // -- lifetimes --------------------------------------------------------------------------------

    static long RssKib()
    {
        if (File.Exists("/proc/self/statm"))
            return long.Parse(File.ReadAllText("/proc/self/statm").Split(' ')[1]) * Environment.SystemPageSize / 1024;
        return Environment.WorkingSet / 1024;
    }

    static void Collect()
    {
        GC.Collect();
        GC.WaitForPendingFinalizers();
        GC.Collect();
    }

    // 100 load/free cycles and 1,000 session create/free cycles, disposed and left to the
    // finalizers: flat memory.
    static void TestCyclesKeepMemoryFlat()
    {
        long warm = 0;
        for (int i = 0; i < 100; i++)
        {
            using (var m = new Model(stories_, new ModelParams { Threads = 1, UseMmap = i % 2 == 0 }))
            using (var s = m.CreateSession())
                s.Eval(m.Tokenize(Prompt), LogitsMode.None);
            if (i % 10 == 9) Collect();
            if (i == 19) warm = RssKib();
        }
        Collect();
        long loads = RssKib() - warm;
        long warmS = 0;
        using (var m = Stories())
        {
            // 40 tokens: two KV blocks (38 KiB) a session, so that a leak shows well above the noise
            var ids = m.Tokenize(string.Concat(Enumerable.Repeat("Once upon a time ", 10)));
            for (int i = 0; i < 1000; i++)
            {
                var s = m.CreateSession(new SessionParams { ContextLength = 64 + i % 4 * 16 });
                s.Eval(ids, LogitsMode.None);
                if (i % 2 == 0) s.Dispose();  // the others are left to the finalizer
                if (i % 100 == 99) Collect();  // as a game between scenes; the GC sees no native memory
                if (i == 199) warmS = RssKib();
            }
            Collect();
        }
        long sessions = RssKib() - warmS;
        Write("CyclesKeepMemoryFlat", "loads " + loads + " KiB\nsessions " + sessions + " KiB\n");
        // The resident set wanders by up to ~4 MiB either way (500 loads: 26 to 30 MiB, no trend); one leaked
        // model is 1 MiB (90 of them 90 MiB), a leaked session 38 KiB or more (400 of them 15 MiB).
        Check(loads < 8192, "100 loads grew " + loads + " KiB");
        Check(sessions < 8192, "1000 sessions grew " + sessions + " KiB");
    }

    // The order of Dispose calls and finalizers never matters.
    static void TestModelOutlivesItsSessions()
    {
        var model = Stories();
        var s = model.CreateSession();
        var f = s.Fork();
        model.Dispose();
        Check(model.IsDisposed, "disposed");
        Throws(() => model.CreateSession(), Status.InvalidArgument, "disposed");
        Check(s.Generate(Prompt, 5, 0f).Length > 0, "a session outlives its Model object");
        s.Dispose();
        Check(f.Generate(" more", 3, 0f) != null, "so does its fork");
        f = null;
        Collect();  // the fork's finalizer frees it, then the native model
        s.Dispose();
        model.Dispose();
    }

    // Unity's domain reload (entering play mode again): an AppDomain loads FastLLM, subscribes to
    // the log, loads a model and generates, and is unloaded without tidying up; 10 times. Then the
    // library logs again in this domain: a callback left pointing into an unloaded domain would
    // crash here (LLMUnity#365).
    static void TestDomainReloads()
    {
        for (int i = 0; i < 10; i++)
        {
            var domain = AppDomain.CreateDomain("play" + i);
            domain.SetData("model", stories_);
            domain.DoCallBack(PlaySession);
            Equal("played", (string)domain.GetData("result"), "the play session's result");
            AppDomain.Unload(domain);
        }
        using (var model = Stories())
        using (var s = model.CreateSession())
            Check(s.Generate(Prompt, 8, 0f).Length > 0, "after the reloads");
    }

    static void PlaySession()
    {
        var d = AppDomain.CurrentDomain;
        int n = 0;
        Library.Log += (level, message) => n++;  // never removed
        var model = new Model((string)d.GetData("model"), new ModelParams { Threads = 1 });
        var s = model.CreateSession();
        var text = s.Generate(Prompt, 8, 0f);
        d.SetData("result", text.Length > 0 && n > 0 ? "played" : "no text or no log message");
        // neither the session nor the model is disposed: the unload finalizes them
    }

    // Run where the native library cannot be found: a FastLLMException saying where to put it.
    static void AloneNoLibrary()
    {
        Throws(() => new Model(stories_), Status.IO, "cannot load the native library");
        Throws(() => { var v = Library.Version; }, Status.IO, "Plugins");
    }

    // -- errors -----------------------------------------------------------------------------------

    static void TestErrorsAreFastLLMExceptions()
    {
        Throws(() => new Model(Path.Combine(out_, "missing.flm")), Status.IO, "missing.flm");
        var damaged = Path.Combine(out_, "damaged.flm");
        File.WriteAllBytes(damaged, File.ReadAllBytes(stories_).Take(4096).ToArray());
        Throws(() => new Model(damaged), Status.BadFormat);
        File.WriteAllBytes(damaged, Encoding.ASCII.GetBytes("not a model at all"));
        Throws(() => new Model(damaged), Status.BadFormat);
        Throws(() => Model.FromBytes(new byte[100]), Status.BadFormat);
        Throws(() => new Model(null), Status.InvalidArgument);
        Throws(() => new Model(stories_, new ModelParams { Device = "tpu" }), Status.InvalidArgument);
        using (var model = Stories())
        {
            var s = model.CreateSession();
            Throws(() => s.Generate(Prompt, new GenerateOptions { Grammar = "root ::= [" }), Status.InvalidArgument, "grammar");
            Throws(() => s.Generate(Prompt, new GenerateOptions { JsonSchema = "{\"type\": " }), Status.InvalidArgument, "json_schema");
            Throws(() => Library.CheckGrammar("root ::= foo"), Status.InvalidArgument);
            Throws(() => s.Eval(new[] { 1, 99999 }), Status.TokenOutOfRange);
            Throws(() => s.LoadState(new byte[] { 1, 2, 3 }), Status.BadFormat);
            Throws(() => s.Truncate(1000), Status.InvalidArgument);
            Throws(() => s.Fork(1000), Status.InvalidArgument);
            Throws(() => s.Generate((string)null, null), Status.InvalidArgument);
            Throws(() => model.CreateSession(new SessionParams { ContextLength = -5 }), Status.InvalidArgument);
            Throws(() => model.ApplyChatTemplate(new[] { new ChatMessage("user", "hi") }), Status.Unsupported);
            Throws(() => model.ApplyChatTemplate(new[] { new ChatMessage("user", "hi") }, true, "{% if %}"), Status.InvalidArgument, "line");
            using (var tiny = model.CreateSession(new SessionParams { ContextLength = 8 }))
                Throws(() => tiny.Eval(model.Tokenize(string.Concat(Enumerable.Repeat("word ", 20)))), Status.ContextFull);
            // a session in use by another thread's call
            var stream = s.GenerateStreamAsync(Prompt, new GenerateOptions { MaxNewTokens = 200, IgnoreEos = true });
            stream.MoveNextAsync().Wait();
            Throws(() => s.Generate("x", 2), Status.InvalidArgument, "in use");
            Throws(() => s.GenerateStreamAsync("x"), Status.InvalidArgument, "in use");  // at the call, not in the task
            var sw = Stopwatch.StartNew();
            stream.Dispose();
            Check(sw.ElapsedMilliseconds < 1000, "Dispose waited " + sw.ElapsedMilliseconds + " ms");
            Check(stream.Result.IsFaulted && stream.Result.Exception.InnerException is OperationCanceledException,
                  "Dispose cancels the stream's generation");
            // disposed before its worker has begun: cancelled all the same, never a whole generation
            var early = s.GenerateStreamAsync(Prompt, new GenerateOptions { MaxNewTokens = 200, IgnoreEos = true });
            early.Dispose();
            Check(early.Result.IsFaulted || early.Result.Result.GeneratedTokens < 200, "an early Dispose cancels");
            Equal(StopReason.MaxTokens, s.Generate(Prompt, Greedy(2)).StopReason, "usable after");
            // Dispose of a session while a GenerateAsync runs on it: it ends, as a FastLLMException or cancelled
            var running = s.GenerateAsync(Prompt, new GenerateOptions { MaxNewTokens = 400, IgnoreEos = true });
            Thread.Sleep(5);
            s.Dispose();
            try { Check(running.Result.GeneratedTokens < 400, "stopped by the Dispose"); }
            catch (AggregateException e) { Check(e.InnerException is FastLLMException, e.InnerException.ToString()); }
            Throws(() => s.Generate(Prompt, 4), Status.InvalidArgument, "disposed");
            Throws(() => { var n = s.TokenCount; }, Status.InvalidArgument, "disposed");
            Check(!s.Cancel(), "cancel of a disposed session is harmless");
            s.Dispose();  // twice is harmless
        }
    }

    // -- model info, memory, log, devices -----------------------------------------------------------

    static void TestInfoMemoryLog()
    {
        var messages = new List<string>();
        Action<LogLevel, string> handler = (level, message) => { lock (messages) messages.Add(level + " " + message); };
        Library.Log += handler;
        try
        {
            using (var model = Stories())
            using (var s = model.CreateSession())
            {
                var info = model.Info;
                Equal("llama", info.Architecture, "architecture");
                Equal(512, info.VocabSize, "vocabulary");
                Equal("f32", info.WeightDtype, "dtype");
                Check(info.Backend.StartsWith("cpu"), info.Backend);
                Check(info.NParams > 200000, "parameters");
                Equal(0, s.Memory.KvBytes == 0 ? 0 : 1, "no KV before evaluation");
                s.Eval(model.Tokenize(Prompt), LogitsMode.None);
                var m = s.Memory;
                Check(m.KvBytes > 0 && m.KvBytesPerToken > 0 && m.KvCapacityBytes >= m.KvBytes, "KV memory");
                Equal(s.ContextLength, model.Info.ContextLength < 4096 ? model.Info.ContextLength : 4096, "n_ctx");
            }
        }
        finally
        {
            Library.Log -= handler;
        }
        lock (messages) Check(messages.Any(x => x.StartsWith("Info") && x.Contains("stories")), "a model-loaded message: " + string.Join(" | ", messages));
        int before = messages.Count;
        using (var model = Stories()) { }
        Equal(before, messages.Count, "no messages after the handler is removed");
        Check(Library.Devices() != null, "devices");
    }

    // -- chat templates and tools -------------------------------------------------------------------

    const string ChatMl = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}" +
                          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    const string Hermes = "{%- if tools %}Call a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}" + ChatMl;

    static void TestChatTemplatesAndTools()
    {
        using (var model = Stories())
        {
            var msgs = new[] { new ChatMessage("system", "You are a guard."), new ChatMessage("user", "Héllo, 世界") };
            var text = model.ApplyChatTemplate(msgs, true, ChatMl);
            var json = model.ApplyChatTemplateJson("{\"messages\": [{\"role\": \"user\", \"content\": \"Open the gate\"}], \"tools\": " +
                                                   NpcTown.Tools + "}", Hermes);
            Write("ChatTemplatesAndTools", text + "\u0001" + json);
            Equal(text, Library.RenderTemplate(ChatMl, "{\"messages\": [{\"role\": \"system\", \"content\": \"You are a guard.\"}, " +
                                                       "{\"role\": \"user\", \"content\": \"Héllo, 世界\"}], \"add_generation_prompt\": true}"), "render");
            var parsed = model.ParseToolCalls("<tool_call>\n{\"name\": \"move_to\", \"arguments\": {\"place\": \"gate\"}}\n</tool_call>",
                                              NpcTown.Tools, Hermes);
            Check(parsed.Contains("\"format\":\"hermes\"") && parsed.Contains("\"name\":\"move_to\""), parsed);
            Equal("[\"<tool_call>\"]", model.ToolCallTriggersJson(Hermes), "hermes triggers");
            var grammar = model.ToolCallGrammar(NpcTown.Tools, "give_item", false, Hermes);
            Library.CheckGrammar(grammar);
            using (var s = model.CreateSession())
            {
                var call = s.Generate("The guard", new GenerateOptions { Grammar = grammar, Temperature = 0.7f, Seed = 1, MaxNewTokens = 320 });
                var p = model.ParseToolCalls(call.Text, NpcTown.Tools, Hermes);
                Check(p.Contains("\"name\":\"give_item\""), call.Text + " -> " + p);
            }
        }
    }

    // The Unity sample's game logic, run here: every NPC acts through a valid call, and the
    // Merchant saved and restored goes on as if it had stayed.
    static void TestNpcSample()
    {
        using (var model = Stories())
        {
            var save = Path.Combine(out_, "merchant.state");
            var runs = new List<string>();
            foreach (bool saving in new[] { true, false })
            {
                var log = new StringBuilder();
                using (var town = new NpcTown(model))
                {
                    Check(town.MemoryOf(0).KvSharedBytes > 0, "NPCs share the world's KV blocks");
                    for (int t = 0; t < 5; t++)
                    {
                        int i = t % town.Count;
                        if (town.IsSaved(i)) town.Restore(i, save);
                        var pieces = new StringBuilder();
                        var turn = town.TakeTurnAsync(i, 16, p => pieces.Append(p)).Result;
                        Equal(turn.Line, pieces.ToString(), "streamed line");
                        Check(turn.Function != null, "a call in " + turn.CallJson);
                        log.Append(turn.Npc).Append(": ").Append(turn.Line.Trim()).Append('\n')
                           .Append(turn.Npc).Append(" does: ").Append(turn.Function).Append(' ').Append(turn.Arguments).Append('\n');
                        if (saving && t == 1) town.Save(1, save);
                    }
                }
                runs.Add(log.ToString());
            }
            Equal(runs[1], runs[0], "the game with a save and without");
            Write("NpcSample", runs[0]);
        }
    }
}
