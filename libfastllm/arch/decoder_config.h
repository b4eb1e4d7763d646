// decoder_config.h — the hyperparameters of the one decoder forward (decoder.cpp). A family file
// (arch/<family>.cpp) reads its .flm metadata into these knobs; nothing else knows the family.
#pragma once

#include <string>
#include <vector>

namespace fastllm {

class FlmFile;

enum class NormKind {
    Rms,    // x / rms(x) * w   (Gemma's x / rms(x) * (1 + w): its converter adds the 1 to w)
    Layer,  // (x - mean) / std(x) * w + b
};
// The MLP's activation: of the gate (a GLU: act(gate) * up) or of the up projection alone.
enum class Act {
    Silu,      // x sigmoid(x)   (SwiGLU)
    GeluTanh,  // GELU's tanh approximation   (GeGLU)
    GeluErf,   // x Phi(x), the exact GELU (BERT)
    Tanh,      // a sequence classifier's pooler
};

// One set of RoPE frequencies; tables of cos and sin are built from it once at load.
struct RopeFreqs {
    std::vector<float> inv_freq;    // dim / 2 values, scaling already applied by the converter
    double attention_factor = 1.0;  // multiplies cos and sin (YaRN, LongRoPE)
};

struct RopeConfig {
    int dim = 0;               // dimensions rotated per head (head_dim, or less: partial rotary)
    bool interleaved = false;  // pairs (2i, 2i + 1) instead of rotate-half's (i, i + dim / 2)
    std::vector<RopeFreqs> sets;
    std::vector<int> layer_set;  // per layer, an index into sets (per-layer base); empty: set 0
    // LongRoPE: a pass whose last position + 1 exceeds original_context rotates with sets[long_set]
    // instead of the layer's set, as transformers' longrope_frequency_update switches.
    int long_set = -1, original_context = 0;
};

// The shape and the masking of one layer's attention.
struct AttentionShape {
    int n_heads, n_kv_heads, head_dim;
    float scale;    // of q . k
    float softcap;  // 0: none, else scores -> softcap * tanh(scores / softcap)
    int window;     // 0: causal; else a query at p sees keys p - window + 1 .. p
    bool causal = true;  // false: every row of a run sees every key of the run (an encoder)
};

struct DecoderConfig {
    std::string arch;  // the .flm architecture, also the metadata key prefix
    int vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
    int num_heads = 0, num_kv_heads = 0, head_dim = 0, context_length = 0;
    float norm_eps = 1e-5f;
    NormKind norm = NormKind::Rms;
    Act act = Act::Silu;
    bool gated_mlp = true;         // act(gate) * up; false: act(up) (BERT: ffn_up, no gate)
    bool causal = true;            // false: bidirectional attention over one pass's run (an encoder)
    bool post_norm = false;        // norm after each residual add (BERT), not before each block
    bool learned_positions = false;  // position_embd and token_types added to the embeddings, then
                                     // token_embd_norm; no RoPE (rope.dim 0)
    int n_token_types = 0;         // rows of token_types (learned_positions)
    bool tied_embeddings = false;
    bool qk_norm = false;          // per-head norm of q and k (over head_dim) before RoPE (Qwen3)
    bool sandwich_norms = false;   // a norm on the attention and FFN outputs before each residual add
    float embedding_scale = 1.0f;  // embeddings are multiplied by it (Gemma: sqrt(hidden))
    float attn_scale = 0.0f;       // query-key scale; 0: 1 / sqrt(head_dim)
    float attn_softcap = 0.0f;     // scores -> cap * tanh(scores / cap); 0: none
    float final_softcap = 0.0f;    // the same for the logits
    std::vector<int> window;       // per layer: keys this many positions old or older are masked; 0: none
    RopeConfig rope;

    int q_dim() const { return num_heads * head_dim; }
    int kv_dim() const { return num_kv_heads * head_dim; }
    int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

// What every family shares: `{arch}.vocab_size`, `.hidden_size`, ... , `.rope.*` and
// `.sliding_window[_layers]` (docs/flm_format.md), validated; a family file calls it first.
void read_common_hparams(const FlmFile &f, DecoderConfig &c);

}  // namespace fastllm
