// PieceStream.cs: a generation running on a worker thread, read as an asynchronous stream of
// pieces. The awaits complete their continuations asynchronously, so in Unity (whose main thread
// has a SynchronizationContext) an `await stream.MoveNextAsync()` resumes on the main thread and the
// generation never runs there.
using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

namespace FastLLM
{
    /// <summary>The pieces of text of a generation that runs on a worker thread
    /// (Session.GenerateStreamAsync). C# 7.3: <c>while (await s.MoveNextAsync()) use(s.Current);</c>;
    /// C# 8 and later: <c>await foreach (var piece in s)</c>. Result completes with the
    /// GenerationResult (or the generation's exception) when it ends.</summary>
    public sealed class PieceStream : IDisposable
    {
        private readonly CancellationTokenSource cancel_;  // the caller's token, linked
        private readonly object lock_ = new object();
        private readonly Queue<string> queue_ = new Queue<string>();
        private TaskCompletionSource<bool> waiter_;
        private bool finished_;
        private Exception error_;

        internal PieceStream(CancellationTokenSource cancel) { cancel_ = cancel; }

        internal void Follow(Task<GenerationResult> generation)
        {
            Result = generation;
            generation.ContinueWith(t =>
            {
                Finish(t.IsFaulted ? t.Exception.InnerException : null);
                cancel_.Dispose();
            }, TaskScheduler.Default);
        }

        /// <summary>The generation's result, once it has ended.</summary>
        public Task<GenerationResult> Result { get; private set; }

        /// <summary>The piece MoveNextAsync moved to.</summary>
        public string Current { get; private set; }

        /// <summary>Waits for the next piece: true with it in Current, false at the end. A failed
        /// generation throws its exception here (OperationCanceledException when cancelled).</summary>
        public Task<bool> MoveNextAsync()
        {
            lock (lock_)
            {
                if (waiter_ != null) throw new InvalidOperationException("a MoveNextAsync is already pending");
                if (queue_.Count > 0)
                {
                    Current = queue_.Dequeue();
                    return Task.FromResult(true);
                }
                if (finished_)
                {
                    if (error_ == null) return Task.FromResult(false);
                    var failed = new TaskCompletionSource<bool>();
                    if (error_ is OperationCanceledException) failed.SetCanceled();
                    else failed.SetException(error_);
                    return failed.Task;
                }
                waiter_ = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
                return waiter_.Task;
            }
        }

        /// <summary>For C# 8's await foreach.</summary>
        public PieceStream GetAsyncEnumerator(CancellationToken cancellation = default(CancellationToken)) { return this; }

        internal void Push(string piece)
        {
            TaskCompletionSource<bool> w;
            lock (lock_)
            {
                w = waiter_;
                waiter_ = null;
                if (w == null) queue_.Enqueue(piece);
                else Current = piece;
            }
            if (w != null) w.SetResult(true);
        }

        private void Finish(Exception e)
        {
            TaskCompletionSource<bool> w;
            lock (lock_)
            {
                finished_ = true;
                error_ = e;
                w = waiter_;
                waiter_ = null;
            }
            if (w == null) return;
            if (e == null) w.SetResult(false);
            else if (e is OperationCanceledException) w.SetCanceled();
            else w.SetException(e);
        }

        /// <summary>Cancels the generation if it is still running (its Result then ends in an
        /// OperationCanceledException) and waits for it to end: within a layer's time while the
        /// prompt is evaluated, before the next token while generating.</summary>
        public void Dispose()
        {
            StopAsync().Wait();
        }

        /// <summary>Dispose without blocking the calling thread (await foreach calls it).</summary>
        public Task DisposeAsync()
        {
            return StopAsync();
        }

        private Task StopAsync()
        {
            if (Result == null) return Task.FromResult(0);
            if (!Result.IsCompleted)
            {
                try { cancel_.Cancel(); } catch (ObjectDisposedException) { }  // it has just ended
            }
            return Result.ContinueWith(t => { }, TaskScheduler.Default);
        }
    }
}
