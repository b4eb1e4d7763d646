// hparams.cpp — the metadata every family shares, read under the architecture's own prefix
// (`qwen3.hidden_size`, as GGUF names its keys), each value checked before the decoder sizes
// anything by it.
#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "arch/decoder_config.h"
#include "format/flm_file.h"

namespace fastllm {

namespace {

int read_dim(const FlmFile &f, const std::string &key, int64_t lo, int64_t hi) {
    int64_t v = f.get_int(key);
    if (v < lo || v > hi)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s = %lld is out of range [%lld, %lld]", f.path().c_str(), key.c_str(),
             (long long)v, (long long)lo, (long long)hi);
    return (int)v;
}

RopeFreqs read_freqs(const FlmFile &f, const std::string &key, double attention_factor, int dim) {
    RopeFreqs r;
    r.inv_freq = f.get_floats(key);
    r.attention_factor = attention_factor;
    if ((int)r.inv_freq.size() != dim / 2)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s has %zu values, rope dim / 2 = %d", f.path().c_str(), key.c_str(),
             r.inv_freq.size(), dim / 2);
    for (float v : r.inv_freq)
        if (!std::isfinite(v))
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s holds a value that is not finite", f.path().c_str(), key.c_str());
    return r;
}

}  // namespace

void read_common_hparams(const FlmFile &f, DecoderConfig &c) {
    const char *path = f.path().c_str();
    const std::string a = c.arch + ".";
    constexpr int64_t kMaxDim = 1 << 20;
    c.vocab_size = read_dim(f, a + "vocab_size", 1, 1 << 24);
    c.hidden_size = read_dim(f, a + "hidden_size", 1, kMaxDim);
    c.intermediate_size = read_dim(f, a + "intermediate_size", 1, kMaxDim);
    c.num_layers = read_dim(f, a + "num_layers", 1, 4096);
    c.num_heads = read_dim(f, a + "num_heads", 1, 4096);
    c.num_kv_heads = read_dim(f, a + "num_kv_heads", 1, c.num_heads);
    c.head_dim = read_dim(f, a + "head_dim", 2, 4096);
    c.context_length = read_dim(f, a + "context_length", 1, 1 << 22);
    // LayerNorm (with biases) where the file gives its epsilon, else RMSNorm.
    c.norm = f.has(a + "layer_norm_eps") ? NormKind::Layer : NormKind::Rms;
    c.norm_eps = (float)f.get_float(a + (c.norm == NormKind::Layer ? "layer_norm_eps" : "rms_norm_eps"));
    c.tied_embeddings = f.get_int(a + "tie_word_embeddings", 0) != 0;
    if (c.num_heads % c.num_kv_heads != 0)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: %d heads, %d KV heads: heads must be a multiple of KV heads", path,
             c.num_heads, c.num_kv_heads);
    if (!(c.norm_eps >= 0 && c.norm_eps < 1))
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s%s = %g is invalid", path, a.c_str(),
             c.norm == NormKind::Layer ? "layer_norm_eps" : "rms_norm_eps", c.norm_eps);

    // An encoder (BERT): bidirectional attention, a norm after each residual add, learned
    // absolute positions and token types instead of RoPE, a non-gated MLP.
    auto flag = [&](const char *key, bool def) {
        const int64_t v = f.get_int(a + key, def);
        if (v != 0 && v != 1) fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s%s = %lld must be 0 or 1", path, a.c_str(), key, (long long)v);
        return v == 1;
    };
    c.causal = flag("causal", true);
    c.post_norm = flag("post_norm", false);
    c.gated_mlp = flag("ffn_gated", true);
    const std::string pos = f.get_string(a + "position_embedding", "rope");
    if (pos != "rope" && pos != "learned")
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: %sposition_embedding '%s' is not rope or learned", path, a.c_str(), pos.c_str());
    c.learned_positions = pos == "learned";
    if (c.learned_positions) c.n_token_types = read_dim(f, a + "token_type_count", 1, 1024);
    if (c.post_norm && c.norm != NormKind::Layer)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: %spost_norm needs LayerNorm (layer_norm_eps)", path, a.c_str());

    // RoPE: the frequencies are stored (scaling applied by the converter, bit-exact with
    // transformers); rope.dim < head_dim rotates only the first dims (partial rotary).
    RopeConfig &r = c.rope;
    if (c.learned_positions) {  // no rotation: one empty set of frequencies
        r.dim = 0;
        r.sets.emplace_back();
    } else {
        r.dim = f.has(a + "rope.dim") ? read_dim(f, a + "rope.dim", 2, c.head_dim) : c.head_dim;
        if (r.dim % 2 != 0) fail(FASTLLM_ERR_BAD_FORMAT, "%s: %srope.dim = %d must be even", path, a.c_str(), r.dim);
        const double factor = f.has(a + "rope.attention_factor") ? f.get_float(a + "rope.attention_factor") : 1.0;
        r.sets.push_back(read_freqs(f, a + "rope.inv_freq", factor, r.dim));
        if (f.has(a + "rope.long_inv_freq")) {
            r.sets.push_back(read_freqs(f, a + "rope.long_inv_freq", factor, r.dim));
            r.long_set = 1;
            r.original_context = read_dim(f, a + "rope.original_context_length", 1, c.context_length);
        }
    }

    // Sliding-window attention: one window for every layer, or one per layer (0: full).
    c.window.assign((size_t)c.num_layers, 0);
    if (f.has(a + "sliding_window_layers")) {
        const auto &w = f.get_ints(a + "sliding_window_layers");
        if ((int)w.size() != c.num_layers)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: %ssliding_window_layers has %zu values for %d layers", path, a.c_str(),
                 w.size(), c.num_layers);
        for (int l = 0; l < c.num_layers; l++) {
            if (w[l] < 0 || w[l] > (1 << 22))
                fail(FASTLLM_ERR_BAD_FORMAT, "%s: %ssliding_window_layers[%d] = %lld is out of range", path, a.c_str(),
                     l, (long long)w[l]);
            c.window[l] = (int)w[l];
        }
    } else if (f.has(a + "sliding_window")) {
        c.window.assign((size_t)c.num_layers, read_dim(f, a + "sliding_window", 0, 1 << 22));
    }

    // A second RoPE set (Gemma 3's sliding layers: another base, no scaling), chosen per layer.
    if (f.has(a + "rope.local_inv_freq")) {
        r.sets.push_back(read_freqs(f, a + "rope.local_inv_freq", 1.0, r.dim));
        const auto &s = f.get_ints(a + "rope.layer_sets");
        if ((int)s.size() != c.num_layers)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: %srope.layer_sets has %zu values for %d layers", path, a.c_str(),
                 s.size(), c.num_layers);
        if (r.long_set >= 0)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: %srope.local_inv_freq cannot be combined with LongRoPE", path, a.c_str());
        for (int64_t v : s) {
            if (v != 0 && v != 1)
                fail(FASTLLM_ERR_BAD_FORMAT, "%s: %srope.layer_sets holds %lld (0: rope.inv_freq, 1: local)", path,
                     a.c_str(), (long long)v);
            r.layer_set.push_back((int)v);
        }
    }

    // The GLU's activation and the optional scales of embeddings, scores and logits (Gemma).
    const std::string act = f.get_string(a + "ffn_activation", "silu");
    if (act == "silu") c.act = Act::Silu;
    else if (act == "gelu_tanh") c.act = Act::GeluTanh;
    else if (act == "gelu_erf") c.act = Act::GeluErf;
    else fail(FASTLLM_ERR_BAD_FORMAT, "%s: %sffn_activation '%s' is not silu, gelu_tanh or gelu_erf", path, a.c_str(), act.c_str());
    if (!c.causal && std::any_of(c.window.begin(), c.window.end(), [](int w) { return w > 0; }))
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: a sliding window needs causal attention", path);
    auto positive = [&](const char *key, float &out) {
        if (!f.has(a + key)) return;
        const double v = f.get_float(a + key);
        if (!(v > 0 && v < 1e30))
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s%s = %g must be a positive number", path, a.c_str(), key, v);
        out = (float)v;
    };
    positive("embedding_scale", c.embedding_scale);
    positive("attention.scale", c.attn_scale);
    positive("attn_logit_softcapping", c.attn_softcap);
    positive("final_logit_softcapping", c.final_softcap);
}

}  // namespace fastllm
