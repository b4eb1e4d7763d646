// NpcDialogue.cs: a MonoBehaviour that runs NpcTown in a Unity scene. Put a .flm model in
// Assets/StreamingAssets (stories260K's will do for a first try), add this component to a
// GameObject and set Model File; the turns appear in the Console, each NPC's line as it is
// generated. The model loads on a worker thread and every generation runs on one, so the frame
// rate does not drop; the awaits come back to the main thread (Unity's SynchronizationContext).
// Leaving play mode cancels the turn in progress and frees the sessions and the model, so the next
// play session loads everything again from a clean state.
using System;
using System.IO;
using System.Threading;
using System.Threading.Tasks;
using FastLLM;
using UnityEngine;

namespace FastLLM.Samples
{
    public sealed class NpcDialogue : MonoBehaviour
    {
        [SerializeField] private string modelFile = "stories260K.flm";
        [SerializeField] private int turns = 6;
        [SerializeField] private int tokensPerLine = 24;

        private Model model_;
        private NpcTown town_;
        private bool playing_;
        private readonly CancellationTokenSource quit_ = new CancellationTokenSource();

        private async void Start()
        {
            var path = Path.Combine(Application.streamingAssetsPath, modelFile);
            var save = Path.Combine(Application.persistentDataPath, "merchant.state");
            playing_ = true;
            try
            {
                model_ = await Task.Run(() => new Model(path));
                if (quit_.IsCancellationRequested) return;
                town_ = await Task.Run(() => new NpcTown(model_));
                for (int t = 0; t < turns && !quit_.IsCancellationRequested; t++)
                {
                    int i = t % town_.Count;
                    if (town_.IsSaved(i)) town_.Restore(i, save);
                    var turn = await town_.TakeTurnAsync(i, tokensPerLine, null, quit_.Token);
                    Debug.Log(turn.Npc + ": " + turn.Line.Trim() + "\n" + turn.Npc + " does: " + turn.Function + " " + turn.Arguments);
                    if (t == 1) town_.Save(1, save);  // a saved game: the Merchant leaves, and comes back at its turn
                }
            }
            catch (OperationCanceledException)
            {
                // play mode ended during a turn
            }
            catch (FastLLMException e)
            {
                Debug.LogError("fastllm: " + e.Message);
            }
            finally
            {
                playing_ = false;
                if (quit_.IsCancellationRequested) Release();
            }
        }

        // Leaving play mode: the turn in progress is cancelled, and what Start loaded is freed once
        // Start has returned (at once when it already has), so that nothing is freed under a turn.
        private void OnDestroy()
        {
            quit_.Cancel();
            if (!playing_) Release();
        }

        private void Release()
        {
            if (town_ != null) town_.Dispose();
            if (model_ != null) model_.Dispose();
            town_ = null;
            model_ = null;
        }
    }
}
