// Errors.cs: every failure of the library, and every misuse of this binding (a disposed handle, a
// session already generating), is a FastLLMException with the status and the library's message.
using System;

namespace FastLLM
{
    /// <summary>A call into fastllm failed. Status is the fastllm_status; Message names it and gives
    /// the library's message for the calling thread (fastllm_last_error).</summary>
    public class FastLLMException : Exception
    {
        public FastLLMException(Status status, string message)
            : base(StatusName(status) + ": " + message)
        {
            Status = status;
            Detail = message;
        }

        /// <summary>The status the library returned.</summary>
        public Status Status { get; private set; }

        /// <summary>The library's message alone (Message prefixes the status name).</summary>
        public string Detail { get; private set; }

        /// <summary>"FASTLLM_ERR_BAD_FORMAT" and so on (fastllm_status_name).</summary>
        public static string StatusName(Status status)
        {
            return Utf8.FromPtr(Native.fastllm_status_name(status));
        }

        /// <summary>Throws for any status but Ok, with the thread's last error message.</summary>
        internal static void Check(Status status)
        {
            if (status != Status.Ok) throw new FastLLMException(status, Utf8.FromPtr(Native.fastllm_last_error()));
        }
    }
}
