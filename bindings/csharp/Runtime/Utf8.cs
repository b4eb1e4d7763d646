// Utf8.cs: strings to and from the C API's NUL-terminated UTF-8 (.NET Standard 2.0 marshals no
// UTF-8 by itself), and the "call again with a bigger buffer" convention of the functions that
// write text.
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Text;

namespace FastLLM
{
    internal static class Utf8
    {
        private static readonly UTF8Encoding Strict = new UTF8Encoding(false, false);

        /// <summary>s as NUL-terminated UTF-8; null stays null (the API's NULL).</summary>
        public static byte[] Z(string s)
        {
            if (s == null) return null;
            var n = Strict.GetByteCount(s);
            var b = new byte[n + 1];
            Strict.GetBytes(s, 0, s.Length, b, 0);
            return b;
        }

        /// <summary>s as NUL-terminated UTF-8 in unmanaged memory (give it back with Free); null gives
        /// IntPtr.Zero.</summary>
        public static IntPtr Alloc(string s)
        {
            var z = Z(s);
            if (z == null) return IntPtr.Zero;
            var p = Marshal.AllocHGlobal(z.Length);
            Marshal.Copy(z, 0, p, z.Length);
            return p;
        }

        /// <summary>Each of strings as Alloc gives it, into ptrs (of the same length): a `const char
        /// *const *` argument. A null string throws; what was allocated is in ptrs, for Free.</summary>
        public static void AllocAll(string[] strings, IntPtr[] ptrs, string what)
        {
            for (int i = 0; i < strings.Length; i++)
            {
                if (strings[i] == null) throw new FastLLMException(Status.InvalidArgument, what + "[" + i + "] is null");
                ptrs[i] = Alloc(strings[i]);
            }
        }

        public static void Free(IntPtr[] ptrs)
        {
            foreach (var p in ptrs)
                if (p != IntPtr.Zero) Marshal.FreeHGlobal(p);
        }

        public static string FromPtr(IntPtr p)
        {
            if (p == IntPtr.Zero) return null;
            int n = 0;
            while (Marshal.ReadByte(p, n) != 0) n++;
            return FromPtr(p, n);
        }

        public static string FromPtr(IntPtr p, int n)
        {
            if (n == 0) return "";
            var b = new byte[n];
            Marshal.Copy(p, b, 0, n);
            return Strict.GetString(b);
        }

        public static string FromBytes(byte[] b, int n)
        {
            return Strict.GetString(b, 0, n);
        }

        /// <summary>A NUL-terminated char array of a struct (fastllm_device_info's).</summary>
        public static string FromFixed(byte[] b)
        {
            if (b == null) return "";
            int n = Array.IndexOf(b, (byte)0);
            return Strict.GetString(b, 0, n < 0 ? b.Length : n);
        }

        public delegate Status TextCall(byte[] buffer, UIntPtr capacity, out UIntPtr length);

        /// <summary>Runs a function that writes NUL-terminated text into a buffer, again with the size
        /// it asked for when the first buffer was too small.</summary>
        public static string Text(TextCall call, int hint)
        {
            var buffer = new byte[Math.Max(hint, 64)];
            UIntPtr length;
            var status = call(buffer, (UIntPtr)buffer.Length, out length);
            if (status == Status.BufferTooSmall)
            {
                buffer = new byte[(int)length + 1];
                status = call(buffer, (UIntPtr)buffer.Length, out length);
            }
            FastLLMException.Check(status);
            return FromBytes(buffer, (int)length);
        }
    }

    /// <summary>Native copies of strings that a params struct points to, freed together.</summary>
    internal sealed class NativeStrings : IDisposable
    {
        private readonly List<IntPtr> blocks_ = new List<IntPtr>();

        public IntPtr Add(string s)
        {
            if (s == null) return IntPtr.Zero;
            var b = Utf8.Z(s);
            var p = Marshal.AllocHGlobal(b.Length);
            blocks_.Add(p);
            Marshal.Copy(b, 0, p, b.Length);
            return p;
        }

        /// <summary>A native array of pointers to copies of the strings (NULL for an empty list).</summary>
        public IntPtr AddArray(IList<string> items)
        {
            if (items == null || items.Count == 0) return IntPtr.Zero;
            var p = Marshal.AllocHGlobal(IntPtr.Size * items.Count);
            blocks_.Add(p);
            for (int i = 0; i < items.Count; i++)
            {
                if (items[i] == null) throw new FastLLMException(Status.InvalidArgument, "a list of strings holds a null");
                Marshal.WriteIntPtr(p, i * IntPtr.Size, Add(items[i]));
            }
            return p;
        }

        public void Dispose()
        {
            foreach (var p in blocks_) Marshal.FreeHGlobal(p);
            blocks_.Clear();
        }
    }
}
