// Session.cs: one conversation over a shared model: its KV cache, generation (a callback, an
// IEnumerable of pieces on the calling thread, or an async stream on a worker thread), fork,
// saved states, cancel.
using System;
using System.Collections.Generic;
using System.Linq;
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

    /// <summary>One conversation over a Model. One call at a time: a call while another (from another
    /// thread, or a GenerateAsync / stream still running) is in progress throws a FastLLMException
    /// (InvalidArgument, "in use") instead of racing; only Cancel and Dispose may come from any
    /// thread. Dispose it when done (a finalizer frees it otherwise).</summary>
    public sealed class Session : IDisposable
    {
        private readonly SessionHandle handle_;
        private readonly ModelHandle model_;  // referenced by handle_ until it is freed
        private readonly int vocab_;
        private int disposed_;  // 1 once Dispose began
        private int busy_;      // 1 while a call uses the session
        private int running_;   // 1 while a native evaluation or generation may run
        private int owner_;     // the thread running it

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
                if (IsDisposed) throw DisposedError();
                return handle_;
            }
        }

        public bool IsDisposed { get { return Volatile.Read(ref disposed_) != 0; } }

        private static FastLLMException DisposedError()
        {
            return new FastLLMException(Status.InvalidArgument, "the Session has been disposed");
        }

        /// <summary>Frees the session (its KV cache blocks; those shared with forks stay with them).
        /// A call in progress on another thread is cancelled, and the session is freed when it
        /// returns.</summary>
        public void Dispose()
        {
            if (Interlocked.Exchange(ref disposed_, 1) != 0) return;
            CancelRunning();
            handle_.Dispose();
        }

        // Runs f as the session's one call: refused while another is in progress, and a Dispose
        // from another thread meanwhile surfaces as the FastLLMException it is.
        private T Use<T>(Func<T> f)
        {
            Enter();
            try { return f(); }
            catch (ObjectDisposedException) { throw DisposedError(); }
            finally { Exit(); }
        }

        private void Use(Action f) { Use(() => { f(); return 0; }); }

        private void Enter()
        {
            if (IsDisposed) throw DisposedError();
            if (Interlocked.CompareExchange(ref busy_, 1, 0) != 0)
                throw new FastLLMException(Status.InvalidArgument, "the Session is in use by another call (one at a time)");
        }

        private void Exit() { Interlocked.Exchange(ref busy_, 0); }

        // -- context ---------------------------------------------------------------------------------

        /// <summary>Tokens in the context (evaluated or pending).</summary>
        public int TokenCount { get { return Use(() => Native.fastllm_session_n_tokens(handle_)); } }

        /// <summary>Of TokenCount, those whose KV cache is held.</summary>
        public int CachedCount { get { return Use(() => Native.fastllm_session_n_cached(handle_)); } }

        /// <summary>Its context length.</summary>
        public int ContextLength { get { return Native.fastllm_session_n_ctx(Handle); } }

        /// <summary>The ids of its context, oldest first.</summary>
        public int[] Tokens
        {
            get
            {
                return Use(() =>
                {
                    var ids = new int[Math.Max(Native.fastllm_session_n_tokens(handle_), 1)];
                    UIntPtr n;
                    FastLLMException.Check(Native.fastllm_session_get_tokens(handle_, ids, (UIntPtr)ids.Length, out n));
                    Array.Resize(ref ids, (int)n);
                    return ids;
                });
            }
        }

        /// <summary>What its memory costs now.</summary>
        public SessionMemory Memory
        {
            get
            {
                return Use(() =>
                {
                    Native.fastllm_session_memory_info m;
                    FastLLMException.Check(Native.fastllm_session_memory(handle_, out m));
                    return new SessionMemory
                    {
                        KvBytes = m.kv_bytes, KvSharedBytes = m.kv_shared_bytes, KvBytesPerToken = m.kv_bytes_per_token,
                        KvCapacityBytes = m.kv_capacity_bytes, SessionBytes = m.session_bytes, ComputeBytes = m.compute_bytes,
                    };
                });
            }
        }

        /// <summary>Forgets all tokens.</summary>
        public void Reset() { Use(() => FastLLMException.Check(Native.fastllm_session_reset(handle_))); }

        /// <summary>Keeps the first nKeep tokens and forgets the rest.</summary>
        public void Truncate(int nKeep) { Use(() => FastLLMException.Check(Native.fastllm_session_truncate(handle_, nKeep))); }

        /// <summary>A new session whose context is the first nTokens (-1: all) of this one's, sharing its
        /// KV cache blocks (copy on write). parameters null: this session's.</summary>
        public Session Fork(int nTokens = -1, SessionParams parameters = null)
        {
            return Use(() =>
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
            });
        }

        /// <summary>Appends tokens to the context and runs the model over them; returns the logits
        /// the mode asks for (Last: vocabulary size floats; All: one row per token; None: null).</summary>
        public float[] Eval(int[] tokens, LogitsMode mode = LogitsMode.Last, CancellationToken cancellation = default(CancellationToken))
        {
            if (tokens == null) throw new FastLLMException(Status.InvalidArgument, "tokens is null");
            float[] logits = mode == LogitsMode.None ? null
                : new float[(mode == LogitsMode.All ? tokens.Length : 1) * vocab_];
            Use(() => Run(cancellation, () => FastLLMException.Check(
                Native.fastllm_session_eval(handle_, tokens, (UIntPtr)tokens.Length, mode, logits))));
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
            return Use(() => GenerateText(prompt, options ?? new GenerateOptions(), onPiece, cancellation));
        }

        /// <summary>Generate after prompt token ids.</summary>
        public GenerationResult Generate(int[] promptTokens, GenerateOptions options, Action<string> onPiece = null,
                                         CancellationToken cancellation = default(CancellationToken))
        {
            if (promptTokens == null) throw new FastLLMException(Status.InvalidArgument, "promptTokens is null");
            return Use(() => GenerateIds(promptTokens, options ?? new GenerateOptions(), onPiece, cancellation));
        }

        private int[] PromptIds(string prompt, GenerateOptions options)
        {
            bool? bos = options.AddBos ?? (Native.fastllm_session_n_tokens(handle_) == 0 ? (bool?)null : false);
            return Model.Tokenize(model_, prompt, bos);
        }

        private GenerationResult GenerateText(string prompt, GenerateOptions options, Action<string> onPiece,
                                              CancellationToken cancellation)
        {
            return GenerateIds(PromptIds(prompt, options), options, onPiece, cancellation);
        }

        private GenerationResult GenerateIds(int[] ids, GenerateOptions options, Action<string> onPiece, CancellationToken cancellation)
        {
            var state = new StreamState { Owner = this, OnPiece = onPiece, Cancellation = cancellation };
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
        /// Stopping the enumeration early ends the generation. The session is in use until the
        /// enumerator is disposed (foreach and LINQ do it; a hand-held enumerator must be).</summary>
        public IEnumerable<string> Stream(string prompt, GenerateOptions options = null)
        {
            if (prompt == null) throw new FastLLMException(Status.InvalidArgument, "prompt is null");
            return StreamPieces(prompt, options ?? new GenerateOptions());
        }

        private IEnumerable<string> StreamPieces(string prompt, GenerateOptions options)
        {
            Enter();
            var state = new StreamState { Owner = this, Collect = true };
            var pin = GCHandle.Alloc(state);
            bool added = false;
            try
            {
                try
                {
                    var ids = PromptIds(prompt, options);
                    using (var strings = new NativeStrings())
                    {
                        var p = options.ToNative(strings);
                        FastLLMException.Check(Native.fastllm_session_begin_generation(handle_, ids, (UIntPtr)ids.Length, ref p,
                                                                                       TextThunk, GCHandle.ToIntPtr(pin)));
                    }
                    handle_.DangerousAddRef(ref added);  // the raw pointer below stays valid while we step
                }
                catch (ObjectDisposedException)
                {
                    throw DisposedError();
                }
                var sessions = new[] { handle_.DangerousGetHandle() };
                var done = new int[1];
                foreach (var piece in state.Take()) yield return piece;
                while (done[0] == 0)
                {
                    if (IsDisposed) throw DisposedError();
                    FastLLMException.Check(Native.fastllm_generate_step(sessions, (UIntPtr)1, done));
                    foreach (var piece in state.Take()) yield return piece;
                }
            }
            finally
            {
                try
                {
                    if (!IsDisposed && Native.fastllm_session_is_generating(handle_) != 0)
                        Native.fastllm_session_cancel_generation(handle_);
                }
                catch (ObjectDisposedException)
                {
                    // disposed meanwhile: freeing the session ends its generation
                }
                if (added) handle_.DangerousRelease();
                pin.Free();
                Exit();
            }
        }

        /// <summary>The generation on a worker thread, so that the calling (Unity main) thread never
        /// blocks: the returned stream gives the pieces as they come (await MoveNextAsync, or
        /// `await foreach` in C# 8), and its Result the GenerationResult. The token, or disposing
        /// the stream, cancels it.</summary>
        public PieceStream GenerateStreamAsync(string prompt, GenerateOptions options = null,
                                               CancellationToken cancellation = default(CancellationToken))
        {
            var cts = CancellationTokenSource.CreateLinkedTokenSource(cancellation);
            var stream = new PieceStream(cts);
            try
            {
                stream.Follow(Background(prompt, options, stream.Push, cts.Token));
            }
            catch
            {
                cts.Dispose();
                throw;
            }
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
                    catch (ObjectDisposedException) { throw DisposedError(); }
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
        /// between two layers, a generation before its next token). False when it is in neither at
        /// this moment (nothing is left pending: to stop a call that may not have begun yet, use
        /// its CancellationToken).</summary>
        public bool Cancel()
        {
            if (IsDisposed) return false;
            try { return Native.fastllm_session_cancel(handle_) == Status.Ok; }
            catch (ObjectDisposedException) { return false; }
        }

        // Runs a native evaluation with the token mapped to fastllm_session_cancel, and lets Dispose
        // cancel it. running_ is set before the disposed check and Dispose sets disposed_ before
        // reading running_ (both full fences), so either the call does not start or Dispose cancels it.
        private void Run(CancellationToken cancellation, Action call)
        {
            owner_ = Thread.CurrentThread.ManagedThreadId;
            Interlocked.Exchange(ref running_, 1);
            try
            {
                if (IsDisposed) throw DisposedError();
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
                    finally
                    {
                        // before the registration's Dispose, which waits for a CancelRunning in progress
                        Interlocked.Exchange(ref running_, 0);
                    }
                }
                cancellation.ThrowIfCancellationRequested();
            }
            finally { Interlocked.Exchange(ref running_, 0); }
        }

        // From another thread: a cancel that comes before the native call has taken the session finds
        // nothing to cancel, so it is repeated until the call takes it or has returned. On the running
        // thread itself (a callback) the text callback's check stops it instead.
        private void CancelRunning()
        {
            if (Thread.CurrentThread.ManagedThreadId == owner_ && Volatile.Read(ref running_) != 0) return;
            try
            {
                while (Volatile.Read(ref running_) != 0 && Native.fastllm_session_cancel(handle_) != Status.Ok) Thread.Yield();
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
            Use(() =>
            {
                var d = draft == null ? null : draft.Handle;
                bool added = false;
                if (d != null) d.DangerousAddRef(ref added);  // before the library holds its pointer
                try
                {
                    var p = Native.fastllm_speculative_default_params();
                    p.draft_model = d == null ? IntPtr.Zero : d.DangerousGetHandle();
                    p.n_draft = nDraft;
                    p.ngram_min = ngramMin;
                    p.ngram_max = ngramMax;
                    p.p_min = pMin;
                    FastLLMException.Check(Native.fastllm_session_set_speculative(handle_, ref p));
                }
                catch
                {
                    if (added) d.DangerousRelease();
                    throw;
                }
                handle_.SwapDraft(d);
            });
        }

        /// <summary>Turns speculative decoding off.</summary>
        public void SpeculativeOff()
        {
            Use(() =>
            {
                FastLLMException.Check(Native.fastllm_session_set_speculative_off(handle_, IntPtr.Zero));
                handle_.SwapDraft(null);
            });
        }

        // -- LoRA adapters ---------------------------------------------------------------------------

        /// <summary>The LoRA adapters the session's evaluations apply from now on, each with its scale
        /// (1: as trained; 0: off); none: the base model. Tokens already evaluated keep their KV
        /// (Reset or Truncate to evaluate them again); a fork takes its source's adapters, and a saved
        /// state loads only under the adapters it was saved with. FastLLMException InvalidArgument: an
        /// adapter of another model, a scale that is not finite, a generation in progress;
        /// Unsupported: the model's layers are on a device (adapters run on the CPU).</summary>
        public void SetAdapters(IEnumerable<KeyValuePair<Adapter, float>> adapters)
        {
            var list = adapters == null ? new List<KeyValuePair<Adapter, float>>() : adapters.ToList();
            Use(() =>
            {
                var handles = new IntPtr[list.Count];
                var scales = new float[list.Count];
                var added = new bool[list.Count];
                try
                {
                    for (int i = 0; i < list.Count; i++)
                    {
                        if (list[i].Key == null) throw new FastLLMException(Status.InvalidArgument, "adapter " + i + " is null");
                        list[i].Key.Handle.DangerousAddRef(ref added[i]);  // until the library holds its own
                        handles[i] = list[i].Key.Handle.DangerousGetHandle();
                        scales[i] = list[i].Value;
                    }
                    FastLLMException.Check(Native.fastllm_session_set_adapters(handle_, handles, scales, (UIntPtr)list.Count));
                }
                catch (ObjectDisposedException)
                {
                    throw new FastLLMException(Status.InvalidArgument, "an Adapter has been disposed");
                }
                finally
                {
                    for (int i = 0; i < list.Count; i++)
                        if (added[i]) list[i].Key.Handle.DangerousRelease();
                }
            });
        }

        /// <summary>One adapter at a scale: SetAdapters with it alone.</summary>
        public void SetAdapter(Adapter adapter, float scale = 1f)
        {
            SetAdapters(new[] { new KeyValuePair<Adapter, float>(adapter, scale) });
        }

        /// <summary>The base model again: no adapters.</summary>
        public void ClearAdapters() { SetAdapters(null); }

        // -- saved states ----------------------------------------------------------------------------

        /// <summary>The session's context (tokens, KV cache) as bytes, for LoadState here or in another
        /// process with the same model.</summary>
        public byte[] SaveState()
        {
            return Use(() =>
            {
                UIntPtr n;
                var status = Native.fastllm_session_save_state(handle_, null, UIntPtr.Zero, out n);
                if (status != Status.BufferTooSmall) FastLLMException.Check(status);
                if ((ulong)n > int.MaxValue)
                    throw new FastLLMException(Status.OutOfMemory, "the state is " + (ulong)n + " bytes, more than a .NET array holds: use SaveStateFile");
                var data = new byte[(int)n];
                FastLLMException.Check(Native.fastllm_session_save_state(handle_, data, (UIntPtr)data.Length, out n));
                return data;
            });
        }

        /// <summary>Replaces the context with a saved state. BadFormat for a state of another model, a
        /// truncated or damaged one (the session stays as it was).</summary>
        public void LoadState(byte[] data)
        {
            if (data == null) throw new FastLLMException(Status.InvalidArgument, "data is null");
            Use(() =>
            {
                FastLLMException.Check(Native.fastllm_session_load_state(handle_, data, (UIntPtr)data.Length, null, IntPtr.Zero));
                EndLoadedGeneration();
            });
        }

        /// <summary>SaveState to a file (written beside it and renamed over it: never half-written).</summary>
        public void SaveStateFile(string path)
        {
            Use(() => FastLLMException.Check(Native.fastllm_session_save_state_file(handle_, Utf8.Z(path))));
        }

        /// <summary>LoadState from a file.</summary>
        public void LoadStateFile(string path)
        {
            Use(() =>
            {
                FastLLMException.Check(Native.fastllm_session_load_state_file(handle_, Utf8.Z(path), null, IntPtr.Zero));
                EndLoadedGeneration();
            });
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
            public Session Owner;
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
                return state.Cancellation.IsCancellationRequested || state.Owner.IsDisposed ? 1 : 0;
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
