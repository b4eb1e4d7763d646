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

        /// <summary>"FASTLLM_ERR_BAD_FORMAT" and so on, as fastllm_status_name says (here without a call
        /// into the library, which may be the thing that failed to load).</summary>
        public static string StatusName(Status status)
        {
            switch (status)
            {
                case Status.Ok: return "FASTLLM_OK";
                case Status.InvalidArgument: return "FASTLLM_ERR_INVALID_ARGUMENT";
                case Status.IO: return "FASTLLM_ERR_IO";
                case Status.BadFormat: return "FASTLLM_ERR_BAD_FORMAT";
                case Status.Unsupported: return "FASTLLM_ERR_UNSUPPORTED";
                case Status.OutOfMemory: return "FASTLLM_ERR_OUT_OF_MEMORY";
                case Status.ContextFull: return "FASTLLM_ERR_CONTEXT_FULL";
                case Status.BufferTooSmall: return "FASTLLM_ERR_BUFFER_TOO_SMALL";
                case Status.TokenOutOfRange: return "FASTLLM_ERR_TOKEN_OUT_OF_RANGE";
                case Status.Internal: return "FASTLLM_ERR_INTERNAL";
                case Status.Cancelled: return "FASTLLM_ERR_CANCELLED";
                default: return "FASTLLM_ERR_" + (int)status;
            }
        }

        /// <summary>Throws for any status but Ok, with the thread's last error message.</summary>
        internal static void Check(Status status)
        {
            if (status != Status.Ok) throw new FastLLMException(status, Utf8.FromPtr(Native.fastllm_last_error()));
        }
    }
}
