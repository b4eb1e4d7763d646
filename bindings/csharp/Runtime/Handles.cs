// Handles.cs: the model and session pointers as SafeHandles. A session holds a reference on its
// model's handle (DangerousAddRef) until it is freed, so the model is freed only after its last
// session, whatever order Dispose calls or finalizers come in: a finalizer never frees a session
// whose model is gone, and Model.Dispose with sessions alive only gives up the Model's own
// reference.
using System;
using System.Runtime.InteropServices;

namespace FastLLM
{
    /// <summary>A fastllm_model pointer; freed with fastllm_model_free once nothing references it.</summary>
    public sealed class ModelHandle : SafeHandle
    {
        public ModelHandle() : base(IntPtr.Zero, true) { }

        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }

        protected override bool ReleaseHandle()
        {
            Native.fastllm_model_free(handle);
            return true;
        }

        /// <summary>A reference on model for a handle that needs it alive (a session, an adapter),
        /// released by that handle; a disposed model is a FastLLMException.</summary>
        internal static void AddRef(ModelHandle model)
        {
            bool added = false;
            try
            {
                model.DangerousAddRef(ref added);
            }
            catch (ObjectDisposedException)
            {
                throw new FastLLMException(Status.InvalidArgument, "the Model has been disposed");
            }
        }
    }

    /// <summary>A fastllm_session pointer; freed with fastllm_session_free, then its model's handle is
    /// released.</summary>
    public sealed class SessionHandle : SafeHandle
    {
        private ModelHandle model_;
        private ModelHandle draft_;

        public SessionHandle() : base(IntPtr.Zero, true) { }

        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }

        internal delegate Status CreateCall(out SessionHandle session);

        /// <summary>Creates a session of model with create, holding a reference on the model's handle
        /// from before the call until the session is freed (so a Dispose of the model on another
        /// thread can never free it under a new session).</summary>
        internal static SessionHandle Create(ModelHandle model, CreateCall create)
        {
            ModelHandle.AddRef(model);
            SessionHandle h = null;
            Status status;
            try
            {
                status = create(out h);
            }
            catch
            {
                model.DangerousRelease();
                throw;
            }
            if (status != Status.Ok)
            {
                var error = new FastLLMException(status, Utf8.FromPtr(Native.fastllm_last_error()));
                model.DangerousRelease();
                if (h != null) h.SetHandleAsInvalid();
                throw error;
            }
            h.model_ = model;
            return h;
        }

        /// <summary>Keeps the draft model of speculative decoding (null: none) for as long as the
        /// session may use it: takes over a reference the caller added, and releases the one held
        /// before.</summary>
        internal void SwapDraft(ModelHandle referencedDraft)
        {
            if (draft_ != null) draft_.DangerousRelease();
            draft_ = referencedDraft;
        }

        protected override bool ReleaseHandle()
        {
            Native.fastllm_session_free(handle);
            if (draft_ != null) draft_.DangerousRelease();
            if (model_ != null) model_.DangerousRelease();
            return true;
        }
    }

    /// <summary>A fastllm_adapter pointer (a LoRA adapter); freed with fastllm_adapter_free (sessions
    /// that apply it keep it alive in the library), then its model's handle is released: the model
    /// goes only after its last adapter.</summary>
    public sealed class AdapterHandle : SafeHandle
    {
        private ModelHandle model_;

        public AdapterHandle() : base(IntPtr.Zero, true) { }

        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }

        /// <summary>Loads the adapter file at path for model, holding a reference on the model's
        /// handle from before the call until the adapter is freed.</summary>
        internal static AdapterHandle Load(ModelHandle model, string path)
        {
            ModelHandle.AddRef(model);
            try
            {
                var h = new AdapterHandle();
                IntPtr p;
                var status = Native.fastllm_adapter_load(model, Utf8.Z(path), out p);
                if (status != Status.Ok) throw new FastLLMException(status, Utf8.FromPtr(Native.fastllm_last_error()));
                h.SetHandle(p);
                h.model_ = model;
                return h;
            }
            catch
            {
                model.DangerousRelease();
                throw;
            }
        }

        protected override bool ReleaseHandle()
        {
            Native.fastllm_adapter_free(handle);
            if (model_ != null) model_.DangerousRelease();
            return true;
        }
    }
}
