// Native.cs: the raw layer, include/fastllm.h one to one. Every struct has the header's fields in the
// header's order with LayoutKind.Sequential, which is the C compiler's layout on every platform
// .NET runs on (tests/test_csharp.py compares Marshal.SizeOf / OffsetOf with the header's sizeof /
// offsetof). Strings go in as NUL-terminated UTF-8 byte arrays (null for NULL) and come out as
// IntPtr (Utf8.FromPtr), because .NET Standard 2.0 has no UTF-8 string marshalling. The model and
// session handles are SafeHandles (Handles.cs): a call holds a reference to the handle for its
// duration, so a Dispose on another thread cannot free it under the call.
//
// FASTLLM_ABI_VERSION of the header this file mirrors is Native.AbiVersion: change both together.
using System;
using System.Runtime.InteropServices;

namespace FastLLM
{
    /// <summary>fastllm_status: what a call into the library returned.</summary>
    public enum Status
    {
        Ok = 0,
        InvalidArgument = 1,
        IO = 2,
        BadFormat = 3,
        Unsupported = 4,
        OutOfMemory = 5,
        ContextFull = 6,
        BufferTooSmall = 7,
        TokenOutOfRange = 8,
        Internal = 9,
        Cancelled = 10,
    }

    /// <summary>fastllm_stop_reason: why a generation ended.</summary>
    public enum StopReason
    {
        Eos = 0,
        MaxTokens = 1,
        StopString = 2,
        Callback = 3,
        ContextFull = 4,
        Cancelled = 5,
        Grammar = 6,
    }

    /// <summary>fastllm_log_level.</summary>
    public enum LogLevel
    {
        Error = 0,
        Warn = 1,
        Info = 2,
        Debug = 3,
    }

    /// <summary>fastllm_kv_type: the element type of a session's KV cache.</summary>
    public enum KvType
    {
        F32 = 0,
        F16 = 1,
        Q8 = 2,
    }

    /// <summary>fastllm_pooling: how Model.Embed makes one vector of an input's.</summary>
    public enum Pooling
    {
        /// <summary>What the model's file says (its sentence-transformers pooling); else Cls for an
        /// encoder, Last for a decoder.</summary>
        Model = -1,
        /// <summary>One vector per token.</summary>
        None = 0,
        Mean = 1,
        Cls = 2,
        Last = 3,
    }

    /// <summary>fastllm_logits_mode.</summary>
    public enum LogitsMode
    {
        None = 0,
        Last = 1,
        All = 2,
    }

    /// <summary>Marks a static method that native code calls back (Unity's IL2CPP compiles such methods
    /// into reverse P/Invoke stubs; it matches the attribute by name, so this one serves without a
    /// reference to Unity's assemblies).</summary>
    [AttributeUsage(AttributeTargets.Method)]
    internal sealed class MonoPInvokeCallbackAttribute : Attribute
    {
        public MonoPInvokeCallbackAttribute(Type type) { Type = type; }
        public Type Type { get; private set; }
    }

    /// <summary>The C API of libfastllm (include/fastllm.h), one declaration per function and struct.</summary>
    public static class Native
    {
        /// <summary>"fastllm": libfastllm.so on Linux (and Android), libfastllm.dylib on macOS,
        /// fastllm.dll on Windows, found by the platform's library search (Unity: the package's
        /// Plugins folder).</summary>
        public const string Library = "fastllm";

        /// <summary>FASTLLM_ABI_VERSION of the header this file mirrors.</summary>
        public const int AbiVersion = 13;

        public const int ThinkingUnset = -1;
        public const int ThinkingOff = 0;
        public const int ThinkingOn = 1;

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_model_params
        {
            public int n_threads;
            public int use_mmap;
            public IntPtr device;
            public int n_gpu_layers;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_model_info
        {
            public IntPtr architecture;
            public IntPtr name;
            public int vocab_size;
            public int context_length;
            public int hidden_size;
            public int num_layers;
            public int num_heads;
            public int num_kv_heads;
            public int head_dim;
            public int bos_id;
            public int eos_id;
            public IntPtr weight_dtype;
            public ulong n_params;
            public IntPtr backend;
            public ulong device_weight_bytes;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_device_info
        {
            public int index;
            public int usable;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 256)] public byte[] name;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 32)] public byte[] vendor;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 16)] public byte[] type;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 128)] public byte[] missing;
            public ulong memory_bytes;
            public uint api_version;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_vulkan_handles
        {
            public IntPtr instance;
            public IntPtr physical_device;
            public IntPtr device;
            public uint queue_family;
            public uint queue_index;
            public IntPtr get_instance_proc_addr;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_chat_message
        {
            public IntPtr role;
            public IntPtr content;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_chat_params
        {
            public int add_generation_prompt;
            public int enable_thinking;
            public IntPtr reasoning_content;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_session_params
        {
            public int n_ctx;
            public int n_batch;
            public int n_threads;
            public int type_k;
            public int type_v;
            public int context_shift;
            public int n_keep;
            public int n_discard;
            public int swa_full;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_session_memory_info
        {
            public ulong kv_bytes;
            public ulong kv_shared_bytes;
            public ulong kv_bytes_per_token;
            public ulong kv_capacity_bytes;
            public ulong session_bytes;
            public ulong compute_bytes;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_sampling_params
        {
            public int max_new_tokens;
            public float temperature;
            public int top_k;
            public float top_p;
            public float min_p;
            public float repetition_penalty;
            public int repeat_last_n;
            public ulong seed;
            public IntPtr stop;
            public int n_stop;
            public int ignore_eos;
            public IntPtr grammar;
            public IntPtr json_schema;
            public IntPtr grammar_triggers;
            public int n_grammar_triggers;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_generation_result
        {
            public int n_prompt_tokens;
            public int n_generated_tokens;
            public int stop_reason;
            public double prompt_ms;
            public double generate_ms;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_step_params
        {
            public int max_prompt_tokens;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_embed_params
        {
            public int pooling;
            public int normalize;
            public int truncate;
            public int add_special;
            public int n_threads;
            public int n_batch;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_rerank_params
        {
            public int normalize;
            public int truncate;
            public int n_threads;
            public int n_batch;
            public IntPtr instruction;
        }

        [StructLayout(LayoutKind.Sequential)]
        public struct fastllm_speculative_params
        {
            public IntPtr draft_model;
            public int n_draft;
            public int ngram_min;
            public int ngram_max;
            public float p_min;
        }

        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        public delegate void fastllm_log_callback(int level, IntPtr message, IntPtr user_data);

        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        public delegate int fastllm_stream_callback(IntPtr text, UIntPtr text_len, IntPtr user_data);

        // -- library --------------------------------------------------------------------------------
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr fastllm_version();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int fastllm_abi_version();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr fastllm_status_name(Status status);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr fastllm_last_error();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr fastllm_isa();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void fastllm_log_set(fastllm_log_callback callback, IntPtr user_data);

        // -- model ----------------------------------------------------------------------------------
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern fastllm_model_params fastllm_model_default_params();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_model_load(byte[] path, ref fastllm_model_params params_, out ModelHandle out_model);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_model_load_from_memory(byte[] data, UIntPtr size, ref fastllm_model_params params_,
                                                                   out ModelHandle out_model);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void fastllm_model_free(IntPtr model);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_vulkan_set_device(ref fastllm_vulkan_handles handles);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_devices([Out] fastllm_device_info[] out_, int capacity, out int out_n);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_model_get_info(ModelHandle model, out fastllm_model_info out_info);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr fastllm_model_chat_template(ModelHandle model);

        // -- tokenizer ------------------------------------------------------------------------------
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_tokenize(ModelHandle model, byte[] text, UIntPtr text_len, int add_bos,
                                                     [Out] int[] out_tokens, UIntPtr out_capacity, out UIntPtr out_n_tokens);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern fastllm_embed_params fastllm_embed_default_params();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_embed(ModelHandle model, IntPtr[] texts, UIntPtr n_texts, ref fastllm_embed_params params_,
                                                  [Out] float[] out_, UIntPtr out_capacity, out UIntPtr out_n_vectors);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_embed_tokens(ModelHandle model, IntPtr[] tokens, UIntPtr[] n_tokens, UIntPtr n_inputs,
                                                         ref fastllm_embed_params params_, [Out] float[] out_, UIntPtr out_capacity,
                                                         out UIntPtr out_n_vectors);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern fastllm_rerank_params fastllm_rerank_default_params();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_rerank(ModelHandle model, byte[] query, IntPtr[] documents, UIntPtr n_documents,
                                                   ref fastllm_rerank_params params_, [Out] float[] out_scores);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_detokenize(ModelHandle model, int[] tokens, UIntPtr n_tokens, [Out] byte[] out_text,
                                                       UIntPtr out_capacity, out UIntPtr out_len);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_token_to_piece(ModelHandle model, int token, [Out] byte[] out_, UIntPtr out_capacity,
                                                           out UIntPtr out_len);

        // -- chat templates and tool calls ----------------------------------------------------------
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_chat_apply_template(ModelHandle model, byte[] tmpl, fastllm_chat_message[] messages,
                                                                UIntPtr n_messages, int add_generation_prompt, [Out] byte[] out_text,
                                                                UIntPtr out_capacity, out UIntPtr out_len);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern fastllm_chat_params fastllm_chat_default_params();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_chat_apply_template_v2(ModelHandle model, byte[] tmpl, fastllm_chat_message[] messages,
                                                                   UIntPtr n_messages, ref fastllm_chat_params params_,
                                                                   [Out] byte[] out_text, UIntPtr out_capacity, out UIntPtr out_len);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_chat_apply_template_json(ModelHandle model, byte[] tmpl, byte[] variables_json,
                                                                     [Out] byte[] out_text, UIntPtr out_capacity, out UIntPtr out_len);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_chat_parse_tool_calls(ModelHandle model, byte[] tmpl, byte[] reply, byte[] tools_json,
                                                                  [Out] byte[] out_json, UIntPtr out_capacity, out UIntPtr out_len);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_chat_tool_text_safe(ModelHandle model, byte[] tmpl, byte[] text, int done,
                                                                out UIntPtr out_safe);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_chat_tool_grammar(ModelHandle model, byte[] tmpl, byte[] tools_json, byte[] tool_name,
                                                              int parallel, [Out] byte[] out_grammar, UIntPtr out_capacity,
                                                              out UIntPtr out_len);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_chat_tool_triggers(ModelHandle model, byte[] tmpl, [Out] byte[] out_json,
                                                               UIntPtr out_capacity, out UIntPtr out_len);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_template_render(byte[] tmpl, byte[] variables_json, [Out] byte[] out_text,
                                                            UIntPtr out_capacity, out UIntPtr out_len);

        // -- sessions -------------------------------------------------------------------------------
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern fastllm_session_params fastllm_session_default_params();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_create(ModelHandle model, ref fastllm_session_params params_,
                                                           out SessionHandle out_session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_fork(SessionHandle src, int n_tokens, ref fastllm_session_params params_,
                                                         out SessionHandle out_session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl, EntryPoint = "fastllm_session_fork")]
        public static extern Status fastllm_session_fork_default(SessionHandle src, int n_tokens, IntPtr params_null,
                                                                 out SessionHandle out_session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void fastllm_session_free(IntPtr session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_memory(SessionHandle session, out fastllm_session_memory_info out_info);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_reset(SessionHandle session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_truncate(SessionHandle session, int n_keep);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int fastllm_session_n_cached(SessionHandle session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int fastllm_session_n_tokens(SessionHandle session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int fastllm_session_n_ctx(SessionHandle session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_get_tokens(SessionHandle session, [Out] int[] out_tokens, UIntPtr out_capacity,
                                                               out UIntPtr out_n_tokens);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_eval(SessionHandle session, int[] tokens, UIntPtr n_tokens, LogitsMode mode,
                                                         [Out] float[] out_logits);

        // -- generation -----------------------------------------------------------------------------
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern fastllm_sampling_params fastllm_sampling_default_params();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_generate(SessionHandle session, int[] prompt_tokens, UIntPtr n_prompt_tokens,
                                                             ref fastllm_sampling_params params_, fastllm_stream_callback callback,
                                                             IntPtr user_data, out fastllm_generation_result out_result);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_begin_generation(SessionHandle session, int[] prompt_tokens,
                                                                     UIntPtr n_prompt_tokens, ref fastllm_sampling_params params_,
                                                                     fastllm_stream_callback callback, IntPtr user_data);
        /// <summary>sessions: raw session pointers (SessionHandle.DangerousGetHandle, each referenced
        /// with DangerousAddRef for the call's duration).</summary>
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_generate_step(IntPtr[] sessions, UIntPtr n_sessions, [Out] int[] out_done);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_begin_generation_deferred(SessionHandle session, int[] prompt_tokens,
                                                                              UIntPtr n_prompt_tokens,
                                                                              ref fastllm_sampling_params params_,
                                                                              fastllm_stream_callback callback, IntPtr user_data);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern fastllm_step_params fastllm_step_default_params();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_generate_step_ex(IntPtr[] sessions, UIntPtr n_sessions, ref fastllm_step_params params_,
                                                             [Out] int[] out_done);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern int fastllm_session_is_generating(SessionHandle session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_generation_result(SessionHandle session, out fastllm_generation_result out_result);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_json_schema_to_grammar(byte[] schema, [Out] byte[] out_, UIntPtr out_capacity,
                                                                   out UIntPtr out_len);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_grammar_check(byte[] grammar);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_cancel_generation(SessionHandle session);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_cancel(SessionHandle session);

        // -- speculative decoding -------------------------------------------------------------------
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern fastllm_speculative_params fastllm_speculative_default_params();
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_set_speculative(SessionHandle session, ref fastllm_speculative_params params_);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl, EntryPoint = "fastllm_session_set_speculative")]
        public static extern Status fastllm_session_set_speculative_off(SessionHandle session, IntPtr params_null);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_speculative_stats(SessionHandle session, out long n_drafted, out long n_accepted);

        // -- LoRA adapters ----------------------------------------------------------------------------
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_adapter_load(ModelHandle model, byte[] path, out IntPtr out_adapter);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern void fastllm_adapter_free(IntPtr adapter);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_set_adapters(SessionHandle session, IntPtr[] adapters, float[] scales,
                                                                 UIntPtr n);

        // -- saved sessions -------------------------------------------------------------------------
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_save_state(SessionHandle session, [Out] byte[] out_, UIntPtr out_capacity,
                                                               out UIntPtr out_len);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_load_state(SessionHandle session, byte[] data, UIntPtr size,
                                                               fastllm_stream_callback callback, IntPtr user_data);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_save_state_file(SessionHandle session, byte[] path);
        [DllImport(Library, CallingConvention = CallingConvention.Cdecl)]
        public static extern Status fastllm_session_load_state_file(SessionHandle session, byte[] path,
                                                                    fastllm_stream_callback callback, IntPtr user_data);
    }
}
