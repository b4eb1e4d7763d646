// Library.cs: what belongs to the native library as a whole: its version and ABI check, the log
// event, the Vulkan devices, and the functions that need no model (templates, grammars).
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;

namespace FastLLM
{
    /// <summary>One Vulkan device of the machine (fastllm_device_info).</summary>
    public sealed class DeviceInfo
    {
        public int Index { get; internal set; }
        public bool Usable { get; internal set; }
        public string Name { get; internal set; }
        public string Vendor { get; internal set; }
        public string Type { get; internal set; }
        public string Missing { get; internal set; }
        public ulong MemoryBytes { get; internal set; }
        public uint ApiVersion { get; internal set; }
        /// <summary>"vulkan:N", the device string of ModelParams.Device that picks it.</summary>
        public string Device { get { return "vulkan:" + Index; } }
    }

    /// <summary>The native library: version, ABI, log messages, devices, and the model-free calls.</summary>
    public static class Library
    {
        private static readonly object lock_ = new object();
        private static volatile bool checked_;
        private static Action<LogLevel, string> log_;
        // Held in a static field so that the collector never frees what native code calls.
        private static readonly Native.fastllm_log_callback logThunk_ = OnLog;

        /// <summary>Throws a FastLLMException unless the native library loads and has the ABI this
        /// assembly was written for (Native.AbiVersion). Model and the other entry points call it;
        /// call it yourself to fail early with the reason.</summary>
        public static void EnsureLoaded()
        {
            if (checked_) return;
            int abi;
            try
            {
                abi = Native.fastllm_abi_version();
            }
            catch (DllNotFoundException e)
            {
                throw new FastLLMException(Status.IO, "cannot load the native library '" + Native.Library +
                    "' (libfastllm.so, fastllm.dll or libfastllm.dylib: put it beside the program, in Unity's " +
                    "Plugins folder for the platform, or on the library path): " + e.Message);
            }
            catch (EntryPointNotFoundException e)
            {
                throw new FastLLMException(Status.Unsupported, "the native library '" + Native.Library +
                    "' is not libfastllm (no fastllm_abi_version): " + e.Message);
            }
            CheckAbi(abi);
            checked_ = true;
        }

        /// <summary>The check EnsureLoaded makes of the library's ABI version.</summary>
        internal static void CheckAbi(int abi)
        {
            if (abi != Native.AbiVersion)
                throw new FastLLMException(Status.Unsupported, "the native library has ABI version " + abi +
                    ", but FastLLM.dll was written for ABI version " + Native.AbiVersion +
                    ": use the libfastllm built from the same fastllm release");
        }

        /// <summary>The native library's version, e.g. "0.6.0".</summary>
        public static string Version { get { EnsureLoaded(); return Utf8.FromPtr(Native.fastllm_version()); } }

        /// <summary>The native library's ABI version (equal to Native.AbiVersion once loaded).</summary>
        public static int AbiVersion { get { EnsureLoaded(); return Native.fastllm_abi_version(); } }

        /// <summary>The instruction set its CPU kernels use: "amx", "avx512", "avxvnni", "avx2", "neon", "scalar", ...</summary>
        public static string Isa { get { EnsureLoaded(); return Utf8.FromPtr(Native.fastllm_isa()); } }

        /// <summary>The library's diagnostics (model loaded, failures, timings). A handler runs on the
        /// thread that called into the library (for a GenerateAsync, the generation's worker thread)
        /// and must not call into fastllm. With no handler the messages are dropped (or sent to stderr
        /// by the FASTLLM_LOG environment variable). The callback is taken back from the library when
        /// the last handler is removed and when the AppDomain unloads (Unity's domain reload), so the
        /// library never calls into an unloaded domain.</summary>
        public static event Action<LogLevel, string> Log
        {
            add
            {
                EnsureLoaded();
                lock (lock_)
                {
                    bool first = log_ == null;
                    log_ += value;
                    if (first)
                    {
                        Native.fastllm_log_set(logThunk_, IntPtr.Zero);
                        AppDomain.CurrentDomain.DomainUnload += OnUnload;
                    }
                }
            }
            remove
            {
                lock (lock_)
                {
                    if (log_ == null) return;
                    log_ -= value;
                    if (log_ == null)
                    {
                        Native.fastllm_log_set(null, IntPtr.Zero);
                        AppDomain.CurrentDomain.DomainUnload -= OnUnload;
                    }
                }
            }
        }

        private static void OnUnload(object sender, EventArgs e)
        {
            lock (lock_)
            {
                log_ = null;
                Native.fastllm_log_set(null, IntPtr.Zero);
            }
        }

        [MonoPInvokeCallback(typeof(Native.fastllm_log_callback))]
        private static void OnLog(int level, IntPtr message, IntPtr user)
        {
            var handlers = log_;
            if (handlers == null) return;
            try
            {
                handlers((LogLevel)level, Utf8.FromPtr(message));
            }
            catch (Exception)
            {
                // an exception must not unwind through the library's frames
            }
        }

        /// <summary>The machine's Vulkan devices (empty when it has none or the library was built
        /// without Vulkan).</summary>
        public static IList<DeviceInfo> Devices()
        {
            EnsureLoaded();
            int n;
            FastLLMException.Check(Native.fastllm_devices(null, 0, out n));
            var raw = new Native.fastllm_device_info[n];
            FastLLMException.Check(Native.fastllm_devices(raw, n, out n));
            var list = new List<DeviceInfo>();
            for (int i = 0; i < Math.Min(n, raw.Length); i++)
            {
                var d = raw[i];
                list.Add(new DeviceInfo
                {
                    Index = d.index, Usable = d.usable != 0, Name = Utf8.FromFixed(d.name), Vendor = Utf8.FromFixed(d.vendor),
                    Type = Utf8.FromFixed(d.type), Missing = Utf8.FromFixed(d.missing), MemoryBytes = d.memory_bytes,
                    ApiVersion = d.api_version,
                });
            }
            return list;
        }

        /// <summary>A GBNF grammar for a JSON Schema (its JSON text), as GenerateOptions.JsonSchema
        /// uses.</summary>
        public static string JsonSchemaToGrammar(string schema)
        {
            EnsureLoaded();
            var z = Utf8.Z(schema);
            return Utf8.Text((byte[] b, UIntPtr c, out UIntPtr n) => Native.fastllm_json_schema_to_grammar(z, b, c, out n), 1024);
        }

        /// <summary>Throws a FastLLMException (InvalidArgument, with line and column) unless grammar is
        /// a valid GBNF grammar.</summary>
        public static void CheckGrammar(string grammar)
        {
            EnsureLoaded();
            FastLLMException.Check(Native.fastllm_grammar_check(Utf8.Z(grammar)));
        }

        /// <summary>Renders any Jinja template over variables given as a JSON object, with no model
        /// (fastllm_template_render).</summary>
        public static string RenderTemplate(string template, string variablesJson)
        {
            EnsureLoaded();
            var t = Utf8.Z(template);
            var v = Utf8.Z(variablesJson ?? "{}");
            return Utf8.Text((byte[] b, UIntPtr c, out UIntPtr n) => Native.fastllm_template_render(t, v, b, c, out n), 4096);
        }
    }
}
