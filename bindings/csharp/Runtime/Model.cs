// Model.cs: a loaded .flm file (weights, config, tokenizer, chat template), shared by any number of
// sessions and threads.
using System;
using System.Collections.Generic;
using System.Text;

namespace FastLLM
{
    /// <summary>How a model is loaded (fastllm_model_params; null fields keep the library's defaults).</summary>
    public sealed class ModelParams
    {
        /// <summary>Threads of its sessions' passes; 0 (default): all cores.</summary>
        public int Threads { get; set; }
        /// <summary>Map the file and use the weights in place (default true); false reads it.</summary>
        public bool UseMmap { get; set; } = true;
        /// <summary>null or "cpu" (default), "vulkan", "vulkan:N" or "auto" (docs/gpu.md).</summary>
        public string Device { get; set; }
        /// <summary>Layers on the device: -1 (default) all, 0 none, n the last n.</summary>
        public int GpuLayers { get; set; } = -1;

        internal Native.fastllm_model_params ToNative(NativeStrings strings)
        {
            var p = Native.fastllm_model_default_params();
            p.n_threads = Threads;
            p.use_mmap = UseMmap ? 1 : 0;
            p.device = strings.Add(Device);
            p.n_gpu_layers = GpuLayers;
            return p;
        }
    }

    /// <summary>What a model is (fastllm_model_info).</summary>
    public sealed class ModelInfo
    {
        public string Architecture { get; internal set; }
        public string Name { get; internal set; }
        public int VocabSize { get; internal set; }
        public int ContextLength { get; internal set; }
        public int HiddenSize { get; internal set; }
        public int NumLayers { get; internal set; }
        public int NumHeads { get; internal set; }
        public int NumKvHeads { get; internal set; }
        public int HeadDim { get; internal set; }
        /// <summary>-1 if none.</summary>
        public int BosId { get; internal set; }
        /// <summary>-1 if none.</summary>
        public int EosId { get; internal set; }
        public string WeightDtype { get; internal set; }
        public ulong NParams { get; internal set; }
        /// <summary>What runs it, e.g. "cpu avx512, 8 threads".</summary>
        public string Backend { get; internal set; }
        public ulong DeviceWeightBytes { get; internal set; }
    }

    /// <summary>A message of a conversation for Model.ApplyChatTemplate.</summary>
    public struct ChatMessage
    {
        public ChatMessage(string role, string content) { Role = role; Content = content; }
        /// <summary>"system", "user" or "assistant".</summary>
        public string Role;
        public string Content;
    }

    /// <summary>A loaded model. Immutable: any number of threads and sessions may use it at once.
    /// Dispose it when done; sessions still alive keep the native model until they are disposed
    /// too (so the order of Dispose calls and finalizers never matters), but no new session can be
    /// created from a disposed Model.</summary>
    public sealed class Model : IDisposable
    {
        private readonly ModelHandle handle_;
        private volatile bool disposed_;

        /// <summary>Loads a .flm file with the default parameters.</summary>
        public Model(string path) : this(path, null) { }

        /// <summary>Loads a .flm file. FastLLMException: IO (missing, unreadable), BadFormat (not a
        /// .flm file, truncated, damaged), Unsupported (an architecture or device this build lacks),
        /// OutOfMemory, InvalidArgument (a null path).</summary>
        public Model(string path, ModelParams parameters)
        {
            Library.EnsureLoaded();
            using (var strings = new NativeStrings())
            {
                var p = (parameters ?? new ModelParams()).ToNative(strings);
                ModelHandle h;
                var status = Native.fastllm_model_load(Utf8.Z(path), ref p, out h);
                handle_ = Adopt(status, h);
            }
        }

        private Model(ModelHandle handle) { handle_ = handle; }

        /// <summary>Loads a model from the bytes of a .flm file (one inside an asset bundle, say).
        /// The bytes are copied; the array may be reused once this returns.</summary>
        public static Model FromBytes(byte[] data, ModelParams parameters = null)
        {
            Library.EnsureLoaded();
            if (data == null) throw new FastLLMException(Status.InvalidArgument, "data is null");
            using (var strings = new NativeStrings())
            {
                var p = (parameters ?? new ModelParams()).ToNative(strings);
                ModelHandle h;
                var status = Native.fastllm_model_load_from_memory(data, (UIntPtr)data.Length, ref p, out h);
                return new Model(Adopt(status, h));
            }
        }

        private static ModelHandle Adopt(Status status, ModelHandle h)
        {
            if (status == Status.Ok) return h;
            var error = new FastLLMException(status, Utf8.FromPtr(Native.fastllm_last_error()));
            if (h != null) h.SetHandleAsInvalid();  // nothing was loaded
            throw error;
        }

        /// <summary>The native handle, for the raw layer (Native). Throws once the Model is disposed.</summary>
        public ModelHandle Handle
        {
            get
            {
                if (disposed_) throw new FastLLMException(Status.InvalidArgument, "the Model has been disposed");
                return handle_;
            }
        }

        // Runs f with a reference on the native model, so that a Dispose on another thread cannot free
        // it while f reads what the model owns (the strings of Info, the template).
        private T With<T>(Func<ModelHandle, T> f)
        {
            var h = Handle;
            bool added = false;
            try
            {
                h.DangerousAddRef(ref added);
                return f(h);
            }
            catch (ObjectDisposedException)
            {
                throw new FastLLMException(Status.InvalidArgument, "the Model has been disposed");
            }
            finally
            {
                if (added) h.DangerousRelease();
            }
        }

        /// <summary>True once Dispose was called.</summary>
        public bool IsDisposed { get { return disposed_; } }

        public void Dispose()
        {
            disposed_ = true;
            handle_.Dispose();
        }

        // The template of the tool-call functions: the given one, else the model's own, else "" (the
        // generic JSON format of a model without a template).
        private string ToolTemplate(string template)
        {
            return template ?? With(h => Native.fastllm_model_chat_template(h) == IntPtr.Zero ? "" : null);
        }

        /// <summary>Config and weights: architecture, sizes, dtype, what runs it.</summary>
        public ModelInfo Info
        {
            get
            {
                return With(h =>
                {
                Native.fastllm_model_info i;
                FastLLMException.Check(Native.fastllm_model_get_info(h, out i));
                return new ModelInfo
                {
                    Architecture = Utf8.FromPtr(i.architecture), Name = Utf8.FromPtr(i.name), VocabSize = i.vocab_size,
                    ContextLength = i.context_length, HiddenSize = i.hidden_size, NumLayers = i.num_layers,
                    NumHeads = i.num_heads, NumKvHeads = i.num_kv_heads, HeadDim = i.head_dim, BosId = i.bos_id,
                    EosId = i.eos_id, WeightDtype = Utf8.FromPtr(i.weight_dtype), NParams = i.n_params,
                    Backend = Utf8.FromPtr(i.backend), DeviceWeightBytes = i.device_weight_bytes,
                };
                });
            }
        }

        /// <summary>The chat template stored in the model, or null.</summary>
        public string ChatTemplate { get { return With(h => Utf8.FromPtr(Native.fastllm_model_chat_template(h))); } }

        /// <summary>Token ids of text; addBos null uses the model's default.</summary>
        public int[] Tokenize(string text, bool? addBos = null) { return With(h => Tokenize(h, text, addBos)); }

        // Also for a session, whose Model object may be disposed while the native model lives on.
        internal static int[] Tokenize(ModelHandle handle, string text, bool? addBos)
        {
            if (text == null) throw new FastLLMException(Status.InvalidArgument, "text is null");
            var bytes = Encoding.UTF8.GetBytes(text);
            int flag = addBos.HasValue ? (addBos.Value ? 1 : 0) : -1;
            var ids = new int[bytes.Length + 8];
            UIntPtr n;
            var status = Native.fastllm_tokenize(handle, bytes, (UIntPtr)bytes.Length, flag, ids, (UIntPtr)ids.Length, out n);
            if (status == Status.BufferTooSmall)
            {
                ids = new int[(int)n];
                status = Native.fastllm_tokenize(handle, bytes, (UIntPtr)bytes.Length, flag, ids, (UIntPtr)ids.Length, out n);
            }
            FastLLMException.Check(status);
            if ((int)n != ids.Length) Array.Resize(ref ids, (int)n);
            return ids;
        }

        /// <summary>Text of token ids, as the model's reference tokenizer decodes them.</summary>
        public string Detokenize(int[] tokens)
        {
            if (tokens == null) throw new FastLLMException(Status.InvalidArgument, "tokens is null");
            return With(h =>
            {
                return Utf8.Text((byte[] b, UIntPtr c, out UIntPtr n) =>
                    Native.fastllm_detokenize(h, tokens, (UIntPtr)tokens.Length, b, c, out n), tokens.Length * 8 + 16);
            });
        }

        /// <summary>The raw bytes one token adds to a stream of text (not always whole characters).</summary>
        public byte[] TokenToPiece(int token)
        {
            return With(h =>
            {
                var b = new byte[64];
                UIntPtr n;
                var status = Native.fastllm_token_to_piece(h, token, b, (UIntPtr)b.Length, out n);
                if (status == Status.BufferTooSmall)
                {
                    b = new byte[(int)n];
                    status = Native.fastllm_token_to_piece(h, token, b, (UIntPtr)b.Length, out n);
                }
                FastLLMException.Check(status);
                Array.Resize(ref b, (int)n);
                return b;
            });
        }

        /// <summary>Renders a conversation into prompt text with the chat template (template, or the
        /// model's own when null), as transformers' apply_chat_template does.</summary>
        public string ApplyChatTemplate(IList<ChatMessage> messages, bool addGenerationPrompt = true, string template = null)
        {
            if (messages == null) throw new FastLLMException(Status.InvalidArgument, "messages is null");
            return With(h =>
            {
                using (var strings = new NativeStrings())
                {
                    var raw = new Native.fastllm_chat_message[messages.Count];
                    for (int i = 0; i < raw.Length; i++)
                    {
                        raw[i].role = strings.Add(messages[i].Role);
                        raw[i].content = strings.Add(messages[i].Content);
                    }
                    var t = Utf8.Z(template);
                    int add = addGenerationPrompt ? 1 : 0;
                    return Utf8.Text((byte[] b, UIntPtr c, out UIntPtr n) =>
                        Native.fastllm_chat_apply_template(h, t, raw, (UIntPtr)raw.Length, add, b, c, out n), 4096);
                }
            });
        }

        /// <summary>The chat template over variables as a JSON object: "messages" in OpenAI's shape
        /// (with tool_calls, tool messages, content parts), "tools", "add_generation_prompt" (true
        /// unless given), "enable_thinking", any other keyword the template reads
        /// (fastllm_chat_apply_template_json).</summary>
        public string ApplyChatTemplateJson(string variablesJson, string template = null)
        {
            return With(h =>
            {
                var t = Utf8.Z(template);
                var v = Utf8.Z(variablesJson);
                return Utf8.Text((byte[] b, UIntPtr c, out UIntPtr n) => Native.fastllm_chat_apply_template_json(h, t, v, b, c, out n), 4096);
            });
        }

        /// <summary>The tool calls in a generated reply, as JSON: {"format": ..., "content": ...,
        /// "tool_calls": [{"name": ..., "arguments": "..."}]}. toolsJson: OpenAI's tool list (null: any
        /// name). A malformed call stays content, never an error.</summary>
        public string ParseToolCalls(string reply, string toolsJson = null, string template = null)
        {
            return With(h =>
            {
                var t = Utf8.Z(ToolTemplate(template));
                var r = Utf8.Z(reply);
                var tools = Utf8.Z(toolsJson);
                return Utf8.Text((byte[] b, UIntPtr c, out UIntPtr n) => Native.fastllm_chat_parse_tool_calls(h, t, r, tools, b, c, out n), 1024);
            });
        }

        /// <summary>A grammar (GenerateOptions.Grammar) whose matches are tool calls in the template's
        /// format to one of the tools (toolName null: any, OpenAI's tool_choice "required") with
        /// arguments that fit the function's schema; parallel allows several calls.</summary>
        public string ToolCallGrammar(string toolsJson, string toolName = null, bool parallel = false, string template = null)
        {
            return With(h =>
            {
                var t = Utf8.Z(ToolTemplate(template));
                var tools = Utf8.Z(toolsJson);
                var name = Utf8.Z(toolName);
                int par = parallel ? 1 : 0;
                return Utf8.Text((byte[] b, UIntPtr c, out UIntPtr n) =>
                    Native.fastllm_chat_tool_grammar(h, t, tools, name, par, b, c, out n), 4096);
            });
        }

        /// <summary>The triggers (GenerateOptions.GrammarTriggers) that make ToolCallGrammar lazy, for
        /// tool_choice "auto": the text is free until a call begins. A JSON array of strings.</summary>
        public string ToolCallTriggersJson(string template = null)
        {
            return With(h =>
            {
                var t = Utf8.Z(ToolTemplate(template));
                return Utf8.Text((byte[] b, UIntPtr c, out UIntPtr n) => Native.fastllm_chat_tool_triggers(h, t, b, c, out n), 256);
            });
        }

        /// <summary>Embeddings of texts (docs/embeddings.md): one vector of Info.HiddenSize floats per
        /// text, pooled as `pooling` says (Pooling.None: one per token of every text in order) and of
        /// length 1 unless `normalize` is false. Texts longer than the model's context are cut
        /// (truncate), or throw FastLLMException (ContextFull). Runs on the calling thread; passes
        /// take turns with the model's sessions'.</summary>
        public float[][] Embed(string[] texts, Pooling pooling = Pooling.Model, bool normalize = true, bool truncate = true)
        {
            if (texts == null) throw new FastLLMException(Status.InvalidArgument, "texts is null");
            var p = Native.fastllm_embed_default_params();
            p.pooling = (int)pooling;
            p.normalize = normalize ? 1 : 0;
            p.truncate = truncate ? 1 : 0;
            var ptrs = new IntPtr[texts.Length];
            try
            {
                Utf8.AllocAll(texts, ptrs, "texts");
                return With(h =>
                {
                    int dim = Native.fastllm_model_get_info(h, out var info) == Status.Ok ? info.hidden_size : 0;
                    UIntPtr n;
                    var status = Native.fastllm_embed(h, ptrs, (UIntPtr)texts.Length, ref p, null, UIntPtr.Zero, out n);
                    if (status != Status.BufferTooSmall) FastLLMException.Check(status);
                    var flat = new float[(int)n * dim];
                    FastLLMException.Check(Native.fastllm_embed(h, ptrs, (UIntPtr)texts.Length, ref p, flat, (UIntPtr)flat.Length, out n));
                    var rows = new float[(int)n][];
                    for (int i = 0; i < rows.Length; i++)
                    {
                        rows[i] = new float[dim];
                        Array.Copy(flat, i * dim, rows[i], 0, dim);
                    }
                    return rows;
                });
            }
            finally
            {
                Utf8.Free(ptrs);
            }
        }

        /// <summary>Each document's score for the query, in the documents' order (higher: more
        /// relevant), by a cross-encoder or a decoder reranker (`instruction`: its task, null: the
        /// file's); with `normalize`, in (0, 1) as sentence-transformers' CrossEncoder gives it.
        /// Throws FastLLMException (Unsupported) for a model that cannot rerank.</summary>
        public float[] Rerank(string query, string[] documents, bool normalize = true, string instruction = null)
        {
            if (query == null || documents == null) throw new FastLLMException(Status.InvalidArgument, "query or documents is null");
            var p = Native.fastllm_rerank_default_params();
            p.normalize = normalize ? 1 : 0;
            var q = Utf8.Z(query);
            var ptrs = new IntPtr[documents.Length];
            try
            {
                p.instruction = Utf8.Alloc(instruction);
                Utf8.AllocAll(documents, ptrs, "documents");
                var scores = new float[documents.Length];
                With(h =>
                {
                    FastLLMException.Check(Native.fastllm_rerank(h, q, ptrs, (UIntPtr)documents.Length, ref p, scores));
                    return 0;
                });
                return scores;
            }
            finally
            {
                Utf8.Free(ptrs);
                Utf8.Free(new[] { p.instruction });
            }
        }

        /// <summary>Loads a LoRA adapter file (convert.py --adapter; docs/lora.md) for this model, to set
        /// on sessions with Session.SetAdapters. FastLLMException: IO, BadFormat (not an adapter, one
        /// of another architecture or shape), InvalidArgument (a null path, a disposed model).</summary>
        public Adapter LoadAdapter(string path)
        {
            if (path == null) throw new FastLLMException(Status.InvalidArgument, "path is null");
            return new Adapter(AdapterHandle.Load(Handle, path), path);
        }

        /// <summary>A session with the default parameters.</summary>
        public Session CreateSession() { return CreateSession(null); }

        /// <summary>A session: one conversation's KV cache over this model.</summary>
        public Session CreateSession(SessionParams parameters)
        {
            var p = (parameters ?? new SessionParams()).ToNative();
            var model = Handle;
            var h = SessionHandle.Create(model, (out SessionHandle s) => Native.fastllm_session_create(model, ref p, out s));
            return new Session(this, model, h);
        }

        /// <summary>A one-off generation in a fresh session (freed afterwards).</summary>
        public string Generate(string prompt, int maxNewTokens, float temperature = 0.8f)
        {
            using (var s = CreateSession()) return s.Generate(prompt, maxNewTokens, temperature);
        }
    }

    /// <summary>A LoRA adapter of a model (Model.LoadAdapter): a character's own voice over the
    /// shared base weights. Dispose frees it; sessions that apply it keep applying it (the library
    /// frees its memory with the last of them).</summary>
    public sealed class Adapter : IDisposable
    {
        internal Adapter(AdapterHandle handle, string path)
        {
            Handle = handle;
            Path = path;
        }

        /// <summary>The native handle, for the raw layer (Native).</summary>
        public AdapterHandle Handle { get; }

        /// <summary>The file it was loaded from.</summary>
        public string Path { get; }

        public void Dispose() { Handle.Dispose(); }
    }
}
