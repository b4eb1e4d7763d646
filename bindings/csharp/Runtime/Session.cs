// Session.cs: one conversation over a shared model: its KV cache, generation (a callback, an
// IEnumerable of pieces on the calling thread, or an async stream on a worker thread), fork,
// saved states, cancel.
using System;
using System.Collections.Generic;
using System.Runtime.ExceptionServices;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace FastLLM
{
    /// <summary>How a session is created (fastllm_session_params; 0 keeps the library's default).</summary>
    public sealed class SessionParams
    {
        /// <summary>Context length in tokens; 0: 4096 or the model's, if shorter.</summary>
        public int ContextLength { get; set; }
        /// <summary>Most tokens one forward pass evaluates; 0: 256.</summary>
        public int BatchSize { get; set; }
        /// <summary>Threads of a pass; 0: the model's.</summary>
        public int Threads { get; set; }
        public KvType TypeK { get; set; } = KvType.F16;
        public KvType TypeV { get; set; } = KvType.F16;
        /// <summary>When the context is full, drop Discard tokens after the first Keep and go on.</summary>
        public bool ContextShift { get; set; }
        public int Keep { get; set; }
        public int Discard { get; set; }
        /// <summary>Sliding-window layers keep every position (llama.cpp's --swa-full).</summary>
        public bool SwaFull { get; set; }

        internal Native.fastllm_session_params ToNative()
        {
            var p = Native.fastllm_session_default_params();
            if (ContextLength != 0) p.n_ctx = ContextLength;
            if (BatchSize != 0) p.n_batch = BatchSize;
            p.n_threads = Threads;
            p.type_k = (int)TypeK;
            p.type_v = (int)TypeV;
            p.context_shift = ContextShift ? 1 : 0;
            p.n_keep = Keep;
            p.n_discard = Discard;
            p.swa_full = SwaFull ? 1 : 0;
            return p;
        }
    }

    /// <summary>Sampling and constraints of a generation (fastllm_sampling_params).</summary>
    public sealed class GenerateOptions
    {
        public int MaxNewTokens { get; set; } = 256;
        /// <summary>&lt;= 0: greedy.</summary>
        public float Temperature { get; set; } = 0.8f;
        public int TopK { get; set; } = 40;
        public float TopP { get; set; } = 0.95f;
        public float MinP { get; set; } = 0.05f;
        public float RepetitionPenalty { get; set; } = 1.0f;
        public int RepeatLastN { get; set; } = 64;
        public ulong Seed { get; set; }
        /// <summary>Stop strings (not part of the output).</summary>
        public IList<string> Stop { get; set; }
        public bool IgnoreEos { get; set; }
        /// <summary>A GBNF grammar the output must follow (docs/grammar.md).</summary>
        public string Grammar { get; set; }
        /// <summary>A JSON Schema (its JSON text) the output must match; not with Grammar.</summary>
        public string JsonSchema { get; set; }
        /// <summary>Makes Grammar / JsonSchema lazy: free text until one of these appears ("^x": x at
        /// the start), as a tool_choice "auto" needs (Model.ToolCallTriggersJson).</summary>
        public IList<string> GrammarTriggers { get; set; }
        /// <summary>Prepend BOS to a text prompt: null (default) when the session is empty.</summary>
        public bool? AddBos { get; set; }

        internal Native.fastllm_sampling_params ToNative(NativeStrings strings)
        {
            var p = Native.fastllm_sampling_default_params();
            p.max_new_tokens = MaxNewTokens;
            p.temperature = Temperature;
            p.top_k = TopK;
            p.top_p = TopP;
            p.min_p = MinP;
            p.repetition_penalty = RepetitionPenalty;
            p.repeat_last_n = RepeatLastN;
            p.seed = Seed;
            p.stop = strings.AddArray(Stop);
            p.n_stop = Stop == null ? 0 : Stop.Count;
            p.ignore_eos = IgnoreEos ? 1 : 0;
            p.grammar = strings.Add(Grammar);
            p.json_schema = strings.Add(JsonSchema);
            p.grammar_triggers = strings.AddArray(GrammarTriggers);
            p.n_grammar_triggers = GrammarTriggers == null ? 0 : GrammarTriggers.Count;
            return p;
        }
    }

    /// <summary>What a generation produced (fastllm_generation_result and its text).</summary>
    public sealed class GenerationResult
    {
        public string Text { get; internal set; }
        public int PromptTokens { get; internal set; }
        public int GeneratedTokens { get; internal set; }
        public StopReason StopReason { get; internal set; }
        public double PromptMs { get; internal set; }
        public double GenerateMs { get; internal set; }

        internal static GenerationResult From(Native.fastllm_generation_result r, string text)
        {
            return new GenerationResult
            {
                Text = text, PromptTokens = r.n_prompt_tokens, GeneratedTokens = r.n_generated_tokens,
                StopReason = (StopReason)r.stop_reason, PromptMs = r.prompt_ms, GenerateMs = r.generate_ms,
            };
        }
    }

    /// <summary>What a session's memory costs (fastllm_session_memory_info).</summary>
    public sealed class SessionMemory
    {
        public ulong KvBytes { get; internal set; }
        public ulong KvSharedBytes { get; internal set; }
        public ulong KvBytesPerToken { get; internal set; }
        public ulong KvCapacityBytes { get; internal set; }
        public ulong SessionBytes { get; internal set; }
        public ulong ComputeBytes { get; internal set; }
    }

    /// <summary>One conversation over a Model. One thread at a time: a call while another thread's
    /// call (or a GenerateAsync / stream) is running on the session throws a FastLLMException
    /// (InvalidArgument) instead of racing; only Cancel may come from any thread. Dispose it when
    /// done (a finalizer frees it otherwise).</summary>
    public sealed class Session : IDisposable
    {
        private readonly SessionHandle handle_;
        private readonly int vocab_;
        private volatile bool disposed_;
        private int busy_;
        private volatile bool running_;  // inside a native evaluation or generation
        private int owner_;              // the thread running it

        private readonly ModelHandle model_;  // referenced by handle_ until it is freed

        internal Session(Model model, ModelHandle modelHandle, SessionHandle handle)
        {
            Model = model;
            model_ = modelHandle;
            handle_ = handle;
            Native.fastllm_model_info info;
            FastLLMException.Check(Native.fastllm_model_get_info(modelHandle, out info));
            vocab_ = info.vocab_size;
        }

        /// <summary>The model it was created from (it may be disposed: the session keeps the native
        /// model alive).</summary>
        public Model Model { get; private set; }

        /// <summary>The native handle, for the raw layer (Native).</summary>
        public SessionHandle Handle
        {
            get
            {
                if (disposed_) throw new FastLLMException(Status.InvalidArgument, "the Session has been disposed");
                return handle_;
            }
        }

        public bool IsDisposed { get { return disposed_; } }

        /// <summary>Frees the session (its KV cache blocks; those shared with forks stay with them).
        /// While a generation runs on another thread, it is cancelled and freed when it returns.</summary>
        public void Dispose()
        {
            if (disposed_) return;
            disposed_ = true;
            if (running_) Native.fastllm_session_cancel(handle_);
            handle_.Dispose();
        }

        private void Enter()
        {
            var h = Handle;  // throws once disposed
            if (Interlocked.CompareExchange(ref busy_, 1, 0) != 0)
                throw new FastLLMException(Status.InvalidArgument, "the Session is in use by another call (one thread at a time)");
        }

        private void Exit() { Interlocked.Exchange(ref busy_, 0); }

        // -- context ---------------------------------------------------------------------------------

        /// <summary>Tokens in the context (evaluated or pending).</summary>
        public int TokenCount { get { return Native.fastllm_session_n_tokens(Handle); } }

        /// <summary>Of TokenCount, those whose KV cache is held.</summary>
        public int CachedCount { get { return Native.fastllm_session_n_cached(Handle); } }

        /// <summary>Its context length.</summary>
        public int ContextLength { get { return Native.fastllm_session_n_ctx(Handle); } }

        /// <summary>The ids of its context, oldest first.</summary>
        public int[] Tokens
        {
            get
            {
                var ids = new int[Math.Max(TokenCount, 1)];
                UIntPtr n;
                var status = Native.fastllm_session_get_tokens(Handle, ids, (UIntPtr)ids.Length, out n);
                if (status == Status.BufferTooSmall)
                {
                    ids = new int[(int)n];
                    status = Native.fastllm_session_get_tokens(Handle, ids, (UIntPtr)ids.Length, out n);
                }
                FastLLMException.Check(status);
                Array.Resize(ref ids, (int)n);
                return ids;
            }
        }

        public SessionMemory Memory
        {
            get
            {
                Native.fastllm_session_memory_info m;
                FastLLMException.Check(Native.fastllm_session_memory(Handle, out m));
                return new SessionMemory
                {
                    KvBytes = m.kv_bytes, KvSharedBytes = m.kv_shared_bytes, KvBytesPerToken = m.kv_bytes_per_token,
                    KvCapacityBytes = m.kv_capacity_bytes, SessionBytes = m.session_bytes, ComputeBytes = m.compute_bytes,
                };
            }
        }

        public void Reset()
        {
            Enter();
            try { FastLLMException.Check(Native.fastllm_session_reset(handle_)); } finally { Exit(); }
        }

        /// <summary>Keeps the first nKeep tokens and forgets the rest.</summary>
        public void Truncate(int nKeep)
        {
            Enter();
            try { FastLLMException.Check(Native.fastllm_session_truncate(handle_, nKeep)); } finally { Exit(); }
        }

        /// <summary>A new session whose context is the first nTokens (-1: all) of this one's, sharing its
        /// KV cache blocks (copy on write). parameters null: this session's.</summary>
        public Session Fork(int nTokens = -1, SessionParams parameters = null)
        {
            Enter();
            try
            {
                int n = nTokens < 0 ? Native.fastllm_session_n_tokens(handle_) : nTokens;
                SessionHandle h;
                if (parameters == null)
                {
                    h = SessionHandle.Create(model_, (out SessionHandle s) => Native.fastllm_session_fork_default(handle_, n, IntPtr.Zero, out s));
                }
                else
                {
                    var p = parameters.ToNative();
                    h = SessionHandle.Create(model_, (out SessionHandle s) => Native.fastllm_session_fork(handle_, n, ref p, out s));
                }
                return new Session(Model, model_, h);
            }
            finally { Exit(); }
        }

        /// <summary>Appends tokens to the context and runs the model over them; returns the logits
        /// the mode asks for (Last: vocabulary size floats; All: one row per token; None: null).</summary>
        public float[] Eval(int[] tokens, LogitsMode mode = LogitsMode.Last, CancellationToken cancellation = default(CancellationToken))
        {
            if (tokens == null) throw new FastLLMException(Status.InvalidArgument, "tokens is null");
            float[] logits = mode == LogitsMode.None ? null
                : new float[(mode == LogitsMode.All ? tokens.Length : 1) * vocab_];
            Run(cancellation, () => FastLLMException.Check(
                Native.fastllm_session_eval(handle_, tokens, (UIntPtr)tokens.Length, mode, logits)));
            return logits;
        }

        // -- generation ------------------------------------------------------------------------------

        /// <summary>Generates up to maxNewTokens after prompt and returns the text.</summary>
        public string Generate(string prompt, int maxNewTokens, float temperature = 0.8f)
        {
            return Generate(prompt, new GenerateOptions { MaxNewTokens = maxNewTokens, Temperature = temperature }).Text;
        }

        /// <summary>Generates after prompt (appended to the context; BOS only on an empty session unless
        /// options.AddBos says), calling onPiece with each piece of text as it comes (on this thread).
        /// A cancelled token stops the prompt's evaluation or the generation and throws
        /// OperationCanceledException; the context keeps what was evaluated.</summary>
        public GenerationResult Generate(string prompt, GenerateOptions options, Action<string> onPiece = null,
                                         CancellationToken cancellation = default(CancellationToken))
        {
            if (prompt == null) throw new FastLLMException(Status.InvalidArgument, "prompt is null");
            Enter();
            try { return GenerateText(prompt, options ?? new GenerateOptions(), onPiece, cancellation); }
            finally { Exit(); }
        }

        private GenerationResult GenerateText(string prompt, GenerateOptions options, Action<string> onPiece,
                                              CancellationToken cancellation)
        {
            var ids = Model.Tokenize(model_, prompt, options.AddBos ?? (Native.fastllm_session_n_tokens(handle_) == 0 ? (bool?)null : false));
            return GenerateIds(ids, options, onPiece, cancellation);
        }

        /// <summary>Generate after prompt token ids.</summary>
        public GenerationResult Generate(int[] promptTokens, GenerateOptions options, Action<string> onPiece = null,
                                         CancellationToken cancellation = default(CancellationToken))
        {
            if (promptTokens == null) throw new FastLLMException(Status.InvalidArgument, "promptTokens is null");
            Enter();
            try { return GenerateIds(promptTokens, options ?? new GenerateOptions(), onPiece, cancellation); }
            finally { Exit(); }
        }

        private GenerationResult GenerateIds(int[] ids, GenerateOptions options, Action<string> onPiece, CancellationToken cancellation)
        {
            var state = new StreamState { OnPiece = onPiece, Cancellation = cancellation };
            var pin = GCHandle.Alloc(state);
            try
            {
                using (var strings = new NativeStrings())
                {
                    var p = options.ToNative(strings);
                    Native.fastllm_generation_result r = default(Native.fastllm_generation_result);
                    Run(cancellation, () => FastLLMException.Check(Native.fastllm_session_generate(
                        handle_, ids, (UIntPtr)ids.Length, ref p, TextThunk, GCHandle.ToIntPtr(pin), out r)));
                    if (state.Error != null) ExceptionDispatchInfo.Capture(state.Error).Throw();
                    return GenerationResult.From(r, state.Text.ToString());
                }
            }
            finally { pin.Free(); }
        }

        /// <summary>The generation's pieces of text as an IEnumerable, produced on the enumerating
        /// thread one token at a time (fastllm_session_begin_generation + fastllm_generate_step).
        /// Stopping the enumeration early (break, Dispose) ends the generation.</summary>
        public IEnumerable<string> Stream(string prompt, GenerateOptions options = null)
        {
            if (prompt == null) throw new FastLLMException(Status.InvalidArgument, "prompt is null");
            return StreamPieces(prompt, options ?? new GenerateOptions());
        }

        private IEnumerable<string> StreamPieces(string prompt, GenerateOptions options)
        {
            Enter();
            var state = new StreamState { Collect = true };
            var pin = GCHandle.Alloc(state);
            bool added = false;
            try
            {
                var ids = Model.Tokenize(model_, prompt, options.AddBos ?? (Native.fastllm_session_n_tokens(handle_) == 0 ? (bool?)null : false));
                using (var strings = new NativeStrings())
                {
                    var p = options.ToNative(strings);
                    FastLLMException.Check(Native.fastllm_session_begin_generation(handle_, ids, (UIntPtr)ids.Length, ref p,
                                                                                   TextThunk, GCHandle.ToIntPtr(pin)));
                }
                handle_.DangerousAddRef(ref added);  // the raw pointer below stays valid while we step
                var sessions = new[] { handle_.DangerousGetHandle() };
                var done = new int[1];
                foreach (var piece in state.Take()) yield return piece;  // text of the prompt's step, if any
                while (done[0] == 0 && !disposed_)
                {
                    FastLLMException.Check(Native.fastllm_generate_step(sessions, (UIntPtr)1, done));
                    foreach (var piece in state.Take()) yield return piece;
                }
            }
            finally
            {
                if (!disposed_ && Native.fastllm_session_is_generating(handle_) != 0)
                    Native.fastllm_session_cancel_generation(handle_);
                if (added) handle_.DangerousRelease();
                pin.Free();
                Exit();
            }
        }

        /// <summary>The generation on a worker thread, so that the calling (Unity main) thread never
        /// blocks: the returned stream gives the pieces as they come (await MoveNextAsync, or
        /// `await foreach` in C# 8), and its Result the GenerationResult. The token cancels it.</summary>
        public PieceStream GenerateStreamAsync(string prompt, GenerateOptions options = null,
                                               CancellationToken cancellation = default(CancellationToken))
        {
            var stream = new PieceStream(this);
            var task = Background(prompt, options, stream.Push, cancellation);
            stream.Follow(task);
            return stream;
        }

        /// <summary>Generate on a worker thread.</summary>
        public Task<GenerationResult> GenerateAsync(string prompt, GenerateOptions options = null, Action<string> onPiece = null,
                                                    CancellationToken cancellation = default(CancellationToken))
        {
            return Background(prompt, options, onPiece, cancellation);
        }

        // The session is taken on the calling thread (a session in use fails here, not in the
        // task), then handed to a dedicated worker thread, which gives it back when done.
        private Task<GenerationResult> Background(string prompt, GenerateOptions options, Action<string> onPiece,
                                                  CancellationToken cancellation)
        {
            if (prompt == null) throw new FastLLMException(Status.InvalidArgument, "prompt is null");
            options = options ?? new GenerateOptions();
            Enter();
            try
            {
                return Task.Factory.StartNew(() =>
                {
                    try { return GenerateText(prompt, options, onPiece, cancellation); }
                    finally { Exit(); }
                }, CancellationToken.None, TaskCreationOptions.LongRunning, TaskScheduler.Default);
            }
            catch
            {
                Exit();
                throw;
            }
        }

        /// <summary>From any thread: stops the evaluation or generation the session is in (the prompt
        /// between two layers, a generation before its next token). False when it is in neither.</summary>
        public bool Cancel()
        {
            if (disposed_) return false;
            try { return Native.fastllm_session_cancel(handle_) == Status.Ok; }
            catch (ObjectDisposedException) { return false; }
        }

        // Runs a native evaluation with the token mapped to fastllm_session_cancel. A cancel from
        // another thread that comes before the native call has begun would find nothing to cancel,
        // so it is repeated until the call takes it or has returned; on the running thread itself
        // (a token already cancelled when registered) the check after registering catches it.
        private void Run(CancellationToken cancellation, Action call)
        {
            owner_ = Thread.CurrentThread.ManagedThreadId;
            running_ = true;
            try
            {
                using (cancellation.Register(CancelRunning))
                {
                    cancellation.ThrowIfCancellationRequested();
                    try
                    {
                        call();
                    }
                    catch (FastLLMException e) when (e.Status == Status.Cancelled && cancellation.IsCancellationRequested)
                    {
                        throw new OperationCanceledException(cancellation);
                    }
                    running_ = false;
                }
                cancellation.ThrowIfCancellationRequested();
            }
            finally { running_ = false; }
        }

        private void CancelRunning()
        {
            if (Thread.CurrentThread.ManagedThreadId == owner_) return;
            try
            {
                while (running_ && !disposed_ && Native.fastllm_session_cancel(handle_) != Status.Ok) Thread.Yield();
            }
            catch (ObjectDisposedException)
            {
                // disposed meanwhile: Dispose cancelled it
            }
        }

        // -- speculative decoding --------------------------------------------------------------------

        /// <summary>Speculative decoding for the next generations: drafts from draft (a smaller model of
        /// the same vocabulary) or, when null, from the context (prompt lookup).</summary>
        public void SetSpeculative(Model draft = null, int nDraft = 5, int ngramMin = 1, int ngramMax = 3, float pMin = 0f)
        {
            Enter();
            try
            {
                var p = Native.fastllm_speculative_default_params();
                var d = draft == null ? null : draft.Handle;
                p.draft_model = d == null ? IntPtr.Zero : d.DangerousGetHandle();
                p.n_draft = nDraft;
                p.ngram_min = ngramMin;
                p.ngram_max = ngramMax;
                p.p_min = pMin;
                FastLLMException.Check(Native.fastllm_session_set_speculative(handle_, ref p));
                handle_.HoldDraft(d);
            }
            finally { Exit(); }
        }

        public void SpeculativeOff()
        {
            Enter();
            try
            {
                FastLLMException.Check(Native.fastllm_session_set_speculative_off(handle_, IntPtr.Zero));
                handle_.HoldDraft(null);
            }
            finally { Exit(); }
        }

        // -- saved states ----------------------------------------------------------------------------

        /// <summary>The session's context (tokens, KV cache) as bytes, for LoadState here or in another
        /// process with the same model.</summary>
        public byte[] SaveState()
        {
            Enter();
            try
            {
                UIntPtr n;
                var status = Native.fastllm_session_save_state(handle_, null, UIntPtr.Zero, out n);
                if (status != Status.BufferTooSmall) FastLLMException.Check(status);
                var data = new byte[(int)n];
                FastLLMException.Check(Native.fastllm_session_save_state(handle_, data, (UIntPtr)data.Length, out n));
                return data;
            }
            finally { Exit(); }
        }

        /// <summary>Replaces the context with a saved state. BadFormat for a state of another model, a
        /// truncated or damaged one (the session stays as it was).</summary>
        public void LoadState(byte[] data)
        {
            if (data == null) throw new FastLLMException(Status.InvalidArgument, "data is null");
            Enter();
            try
            {
                FastLLMException.Check(Native.fastllm_session_load_state(handle_, data, (UIntPtr)data.Length, null, IntPtr.Zero));
                EndLoadedGeneration();
            }
            finally { Exit(); }
        }

        /// <summary>SaveState to a file (written beside it and renamed over it: never half-written).</summary>
        public void SaveStateFile(string path)
        {
            Enter();
            try { FastLLMException.Check(Native.fastllm_session_save_state_file(handle_, Utf8.Z(path))); }
            finally { Exit(); }
        }

        public void LoadStateFile(string path)
        {
            Enter();
            try
            {
                FastLLMException.Check(Native.fastllm_session_load_state_file(handle_, Utf8.Z(path), null, IntPtr.Zero));
                EndLoadedGeneration();
            }
            finally { Exit(); }
        }

        // A state saved by C code in the middle of a step-wise generation brings that generation
        // along; this binding has no way to continue it, so it ends (its tokens stay).
        private void EndLoadedGeneration()
        {
            if (Native.fastllm_session_is_generating(handle_) != 0) Native.fastllm_session_cancel_generation(handle_);
        }

        // -- the text callback -----------------------------------------------------------------------

        internal sealed class StreamState
        {
            public Action<string> OnPiece;
            public bool Collect;  // keep the pieces for Take (Stream)
            public CancellationToken Cancellation;
            public readonly StringBuilder Text = new StringBuilder();
            public List<string> Pending = new List<string>();
            public Exception Error;

            public List<string> Take()
            {
                var p = Pending;
                Pending = new List<string>();
                return p;
            }
        }

        private static readonly Native.fastllm_stream_callback TextThunk = OnText;

        [MonoPInvokeCallback(typeof(Native.fastllm_stream_callback))]
        private static int OnText(IntPtr text, UIntPtr length, IntPtr user)
        {
            var state = (StreamState)GCHandle.FromIntPtr(user).Target;
            try
            {
                var piece = Utf8.FromPtr(text, (int)length);
                state.Text.Append(piece);
                if (state.OnPiece != null) state.OnPiece(piece);
                if (state.Collect) state.Pending.Add(piece);
                return state.Cancellation.IsCancellationRequested ? 1 : 0;
            }
            catch (Exception e)
            {
                // never unwind through the library: stop, and rethrow once it has returned
                state.Error = e;
                return 1;
            }
        }
    }
}
