#include "arch/decoder.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"

namespace fastllm {

namespace {

// Looks up a tensor and checks its shape; optional tensors may be absent (empty view).
Tensor get(const FlmFile &f, const std::string &name, std::initializer_list<int64_t> shape, bool optional = false,
           bool must_be_f32 = false) {
    if (optional && !f.has_tensor(name)) return Tensor{};
    const Tensor &t = f.tensor(name);  // throws "missing tensor"
    bool ok = t.n_dims == (int)shape.size();
    int d = 0;
    for (int64_t want : shape) ok = ok && t.dims[d++] == want;
    if (!ok) {
        std::string want, got;
        for (int64_t v : shape) want += std::to_string(v) + " ";
        for (int i = 0; i < t.n_dims; i++) got += std::to_string(t.dims[i]) + " ";
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' has shape [ %s], the config implies [ %s]", f.path().c_str(),
             name.c_str(), got.c_str(), want.c_str());
    }
    if (must_be_f32 && t.dtype != DType::F32)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' must be f32, is %s", f.path().c_str(), name.c_str(),
             dtype_name(t.dtype));
    return t;
}

RopeTable make_rope_table(const RopeFreqs &freqs, int positions) {
    RopeTable r;
    r.positions = positions, r.half = (int)freqs.inv_freq.size();
    r.cos.resize((size_t)positions * r.half);
    r.sin.resize(r.cos.size());
    for (int pos = 0; pos < positions; pos++)
        for (int i = 0; i < r.half; i++) {
            const float angle = (float)pos * freqs.inv_freq[i];  // f32 product, as the reference computes it
            r.cos[(size_t)pos * r.half + i] = (float)(std::cos((double)angle) * freqs.attention_factor);
            r.sin[(size_t)pos * r.half + i] = (float)(std::sin((double)angle) * freqs.attention_factor);
        }
    return r;
}

}  // namespace

Decoder::Decoder(const FlmFile &f, DecoderConfig config) : cfg_(std::move(config)) {
    const DecoderConfig &c = cfg_;
    const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
    const bool layer_norm = c.norm == NormKind::Layer;  // LayerNorm has a bias; RMSNorm has none
    embedding_ = get(f, "token_embd.weight", {V, H});
    if (c.learned_positions) {
        position_embd_ = get(f, "position_embd.weight", {c.context_length, H});
        token_types_ = get(f, "token_types.weight", {c.n_token_types, H});
        embd_norm_ = get(f, "token_embd_norm.weight", {H}, false, true);
        embd_norm_bias_ = get(f, "token_embd_norm.bias", {H}, !layer_norm, true);
    }
    // Post-norm leaves every layer's output normed: no final norm. An encoder needs no output head.
    if (!c.post_norm) {
        output_norm_ = get(f, "output_norm.weight", {H}, false, true);
        output_norm_bias_ = get(f, "output_norm.bias", {H}, !layer_norm, true);
    }
    output_ = c.tied_embeddings ? embedding_ : get(f, "output.weight", {V, H}, !c.causal);
    // A sequence classifier (BertForSequenceClassification): dense + tanh over a row's hidden
    // state (BERT's pooler), then the labels.
    if (f.has_tensor("cls.output.weight")) {
        if (c.causal || !c.post_norm)
            fail(FASTLLM_ERR_UNSUPPORTED, "%s: a classifier head needs a post-norm encoder", f.path().c_str());
        pooler_ = get(f, "cls.weight", {H, H});
        pooler_bias_ = get(f, "cls.bias", {H}, false, true);
        const Tensor &out = f.tensor("cls.output.weight");
        if (out.n_dims != 2 || out.dims[1] != H || out.dims[0] < 1 || out.dims[0] > std::min<int64_t>(4096, V))
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: cls.output.weight must be [labels, %lld], at most %lld labels", f.path().c_str(),
                 (long long)H, (long long)std::min<int64_t>(4096, V));
        classifier_ = get(f, "cls.output.weight", {out.dims[0], H});
        classifier_bias_ = get(f, "cls.output.bias", {out.dims[0]}, false, true);
    }
    if (!output_.empty() && output_norm_.empty())
        fail(FASTLLM_ERR_UNSUPPORTED, "%s: an output head without output_norm (post-norm) is not supported", f.path().c_str());
    for (int l = 0; l < c.num_layers; l++) {
        const std::string p = "blk." + std::to_string(l) + ".";
        DecoderLayer L;
        // Post-norm: attn_norm and ffn_norm are the norms after the attention's and the MLP's
        // residual adds (llama.cpp's names for BERT's).
        const std::string attn_norm = c.post_norm ? "attn_output_norm" : "attn_norm";
        const std::string ffn_norm = c.post_norm ? "layer_output_norm" : "ffn_norm";
        L.attn_norm = get(f, p + attn_norm + ".weight", {H}, false, true);
        L.attn_norm_bias = get(f, p + attn_norm + ".bias", {H}, !layer_norm, true);
        L.qkv = get(f, p + "attn_qkv.weight", {c.qkv_dim(), H});
        L.qkv_bias = get(f, p + "attn_qkv.bias", {c.qkv_dim()}, true, true);
        if (c.qk_norm) {
            L.q_norm = get(f, p + "attn_q_norm.weight", {hd}, false, true);
            L.k_norm = get(f, p + "attn_k_norm.weight", {hd}, false, true);
        }
        L.attn_output = get(f, p + "attn_output.weight", {H, c.q_dim()});
        L.attn_output_bias = get(f, p + "attn_output.bias", {H}, true, true);
        L.ffn_norm = get(f, p + ffn_norm + ".weight", {H}, false, true);
        L.ffn_norm_bias = get(f, p + ffn_norm + ".bias", {H}, !layer_norm, true);
        const std::string up = c.gated_mlp ? "ffn_gate_up" : "ffn_up";  // non-gated: the up rows only
        const int64_t up_rows = c.gated_mlp ? 2 * I : I;
        L.gate_up = get(f, p + up + ".weight", {up_rows, H});
        L.gate_up_bias = get(f, p + up + ".bias", {up_rows}, true, true);
        L.down = get(f, p + "ffn_down.weight", {H, I});
        L.down_bias = get(f, p + "ffn_down.bias", {H}, true, true);
        if (c.sandwich_norms) {
            L.post_attn_norm = get(f, p + "post_attention_norm.weight", {H}, false, true);
            L.post_ffn_norm = get(f, p + "post_ffw_norm.weight", {H}, false, true);
        }
        layers_.push_back(L);
    }
    for (const auto &kv : f.tensors()) n_params_ += (uint64_t)kv.second.n_elements();

    // RoPE tables, one per set of frequencies; LongRoPE's short set only serves positions below
    // the original context (a pass reaching past it switches to the long set).
    for (size_t s = 0; s < c.rope.sets.size(); s++) {
        const bool short_only = c.rope.long_set >= 0 && (int)s != c.rope.long_set;
        rope_.push_back(make_rope_table(c.rope.sets[s], short_only ? c.rope.original_context : c.context_length));
    }
    for (int set : c.rope.layer_set)
        if (set < 0 || set >= (int)rope_.size())
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: a layer names RoPE set %d of %zu", f.path().c_str(), set, rope_.size());
}

int64_t Decoder::max_row_length() const {
    return std::max({(int64_t)cfg_.hidden_size, (int64_t)cfg_.q_dim(), (int64_t)cfg_.intermediate_size});
}

const Tensor &Decoder::matrix(int layer, int m) const {
    const DecoderLayer &L = layers_[(size_t)layer];
    return m == kLoraQkv ? L.qkv : m == kLoraAttnOutput ? L.attn_output : m == kLoraGateUp ? L.gate_up : L.down;
}

PassShape Decoder::pass_shape(int max_batch) const {
    return PassShape{max_row_length(), max_batch, cfg_.head_dim, (int64_t)cfg_.kv_dim()};
}

void Decoder::carve(Arena &a, Workspace &w, int B) const {
    const DecoderConfig &c = cfg_;
    w.max_batch = B;
    w.x = a.take((size_t)B * c.hidden_size);
    w.xb = a.take((size_t)B * c.hidden_size);
    w.q = a.take((size_t)B * c.q_dim());
    w.qkv = a.take((size_t)B * c.qkv_dim());
    w.attn = a.take((size_t)B * c.q_dim());
    w.gate_up = a.take((size_t)B * 2 * c.intermediate_size);
    w.act = a.take((size_t)B * c.intermediate_size);
    w.logits = a.take((size_t)kLogitRows * c.vocab_size);
    w.rope.assign((size_t)B, nullptr);
    w.runs.resize((size_t)B);
    w.boundary.resize((size_t)2 * B * c.hidden_size);
    w.ids.resize((size_t)B);
}

std::vector<const Tensor *> Decoder::weights(int first_layer, int end_layer, bool embedding, bool head) const {
    std::vector<const Tensor *> all;
    auto add = [&](const Tensor &t) {
        if (!t.empty()) all.push_back(&t);
    };
    if (embedding)
        for (const Tensor *t : {&embedding_, &position_embd_, &token_types_, &embd_norm_, &embd_norm_bias_}) add(*t);
    if (head)
        for (const Tensor *t : {&output_norm_, &output_norm_bias_, &output_, &pooler_, &pooler_bias_, &classifier_, &classifier_bias_})
            add(*t);
    for (int l = first_layer; l < end_layer; l++) {
        const DecoderLayer &L = layers_[l];
        for (const Tensor *t : {&L.attn_norm, &L.attn_norm_bias, &L.qkv, &L.qkv_bias, &L.q_norm, &L.k_norm,
                                &L.attn_output, &L.attn_output_bias, &L.post_attn_norm, &L.ffn_norm, &L.ffn_norm_bias,
                                &L.gate_up, &L.gate_up_bias, &L.down, &L.down_bias, &L.post_ffn_norm})
            add(*t);
    }
    return all;
}

void Decoder::shift_cache(const std::vector<Stage> &stages, KvCache &cache, int from, int n_rows, int delta) const {
    const DecoderConfig &c = cfg_;
    if (n_rows <= from) return;
    std::vector<std::vector<float>> cos(c.rope.sets.size()), sin(c.rope.sets.size());
    for (size_t s = 0; s < c.rope.sets.size(); s++)
        for (float f : c.rope.sets[s].inv_freq) {
            cos[s].push_back((float)std::cos((double)delta * f));
            sin[s].push_back((float)-std::sin((double)delta * f));
        }
    // LongRoPE: keys past the original context were written with the long frequencies.
    const bool long_rope = c.rope.long_set >= 0 && n_rows > c.rope.original_context;
    for (int l = 0; l < c.num_layers; l++) {
        const int set = long_rope ? c.rope.long_set : c.rope.layer_set.empty() ? 0 : c.rope.layer_set[l];
        const KeyShift ks{c.num_kv_heads, c.head_dim, c.rope.dim, c.rope.interleaved, cos[set].data(), sin[set].data()};
        for (const Stage &st : stages)
            if (l >= st.first_layer && l < st.end_layer) st.be->shift_cache(cache, l, from, n_rows - from, delta, ks);
    }
}

bool Decoder::forward(const std::vector<Stage> &stages, const int32_t *tokens, const ForwardRow *rows, int T,
                      const std::atomic<bool> *cancel) const {
    const DecoderConfig &c = cfg_;
    const int H = c.hidden_size, I = c.intermediate_size;
    const NormKind nk = c.norm;
    const float eps = c.norm_eps;
    const float scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt((float)c.head_dim);
    // Runs of rows of one cache at consecutive positions (a prompt): fn(first row, count).
    auto for_each_run = [&](auto &&fn) {
        for (int t = 0; t < T;) {
            int g = 1;
            while (t + g < T && rows[t + g].cache == rows[t].cache && rows[t + g].pos == rows[t].pos + g) g++;
            fn(t, g);
            t += g;
        }
    };
    auto finish_all = [&] {
        for (const Stage &st : stages) st.be->finish();
    };
    bool any_lora = false;
    for (int t = 0; t < T; t++) any_lora = any_lora || rows[t].lora;

    for (size_t si = 0; si < stages.size(); si++) {
        Backend &be = *stages[si].be;
        Workspace &w = *stages[si].w;
        int n_runs = 0;
        for_each_run([&](int t, int g) { w.runs[n_runs++] = AttentionRun{t, g, rows[t].pos, rows[t].cache}; });
        if (si == 0) {
            be.embed(embedding_, tokens, T, c.embedding_scale, w.x);
            if (c.learned_positions) {  // x = norm(x + positions' rows + token types' rows)
                for (int t = 0; t < T; t++) w.ids[t] = rows[t].pos;
                be.embed(position_embd_, w.ids.data(), T, 1.0f, w.xb);
                be.add_norm(nk, eps, Tensor{}, w.xb, w.x, Tensor{}, Tensor{}, T, H, w.xb);
                for (int t = 0; t < T; t++) w.ids[t] = rows[t].type;
                be.embed(token_types_, w.ids.data(), T, 1.0f, w.xb);
                be.add_norm(nk, eps, Tensor{}, w.xb, w.x, embd_norm_, embd_norm_bias_, T, H, w.x);
            }
            if (!c.post_norm) be.norm(nk, eps, layers_[0].attn_norm, layers_[0].attn_norm_bias, w.x, T, H, w.xb);
        } else {  // the hidden state and its norm from the stage before
            Workspace &prev = *stages[si - 1].w;
            const size_t n = (size_t)T * H;
            stages[si - 1].be->download(prev.boundary.data(), prev.x, n * sizeof(float));
            stages[si - 1].be->download(prev.boundary.data() + n, prev.xb, n * sizeof(float));
            be.upload(w.x, prev.boundary.data(), n * sizeof(float));
            be.upload(w.xb, prev.boundary.data() + n, n * sizeof(float));
        }
        for (int l = stages[si].first_layer; l < stages[si].end_layer; l++) {
            const DecoderLayer &L = layers_[l];
            const int set = c.rope.layer_set.empty() ? 0 : c.rope.layer_set[l];
            for_each_run([&](int t, int g) {
                const bool long_rope = c.rope.long_set >= 0 && rows[t + g - 1].pos + 1 > c.rope.original_context;
                for (int i = 0; i < g; i++) w.rope[t + i] = &rope_[long_rope ? c.rope.long_set : set];
            });

            // Attention block: (normed input in xb) fused QKV projection, q/k norms and RoPE into the
            // cache, attention per run of rows, output projection, residual add.
            // A block's input: its norm of x (pre-norm), or x, normed by the block before (post-norm).
            const float *in = c.post_norm ? w.x : w.xb;
            be.matmul(L.qkv, L.qkv_bias, in, T, w.qkv);
            if (any_lora) be.lora(rows, T, l, kLoraQkv, in, L.qkv.cols(), w.qkv, L.qkv.rows());
            QkvStep qs{w.qkv, w.q, T, c.num_heads, c.num_kv_heads, c.head_dim, c.qk_norm ? &L.q_norm : nullptr,
                       c.qk_norm ? &L.k_norm : nullptr, nk, eps, c.rope.dim, c.rope.interleaved, w.rope.data(), rows, l};
            be.qkv_to_cache(qs);
            const AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, scale, c.attn_softcap, c.window[l], c.causal};
            be.attention(w.q, w.runs.data(), n_runs, l, shape, w.attn);
            be.matmul(L.attn_output, L.attn_output_bias, w.attn, T, w.xb);
            if (any_lora) be.lora(rows, T, l, kLoraAttnOutput, w.attn, L.attn_output.cols(), w.xb, L.attn_output.rows());
            if (c.post_norm) be.add_norm(nk, eps, Tensor{}, w.xb, w.x, L.attn_norm, L.attn_norm_bias, T, H, w.x);
            else be.add_norm(nk, eps, L.post_attn_norm, w.xb, w.x, L.ffn_norm, L.ffn_norm_bias, T, H, w.xb);

            // MLP block: fused gate/up projection, GLU (or the up projection and its activation),
            // down projection, residual add (with the next layer's input norm, or post-norm's).
            be.matmul(L.gate_up, L.gate_up_bias, in, T, w.gate_up);
            if (any_lora) be.lora(rows, T, l, kLoraGateUp, in, L.gate_up.cols(), w.gate_up, L.gate_up.rows());
            if (c.gated_mlp) be.glu(c.act, w.gate_up, T, I, w.act);
            else be.act(c.act, w.gate_up, (size_t)T * I, w.act);
            be.matmul(L.down, L.down_bias, w.act, T, w.xb);
            if (any_lora) be.lora(rows, T, l, kLoraDown, w.act, L.down.cols(), w.xb, L.down.rows());
            const bool last = l + 1 == c.num_layers;
            if (c.post_norm) be.add_norm(nk, eps, Tensor{}, w.xb, w.x, L.ffn_norm, L.ffn_norm_bias, T, H, w.x);
            else
                be.add_norm(nk, eps, L.post_ffn_norm, w.xb, w.x, last ? Tensor{} : layers_[l + 1].attn_norm,
                            last ? Tensor{} : layers_[l + 1].attn_norm_bias, T, H, w.xb);
            be.flush();
            if (cancel && cancel->load(std::memory_order_relaxed)) {  // SmolLM2, 256 tokens: 17 ms a layer
                finish_all();
                return false;
            }
        }
    }

    // Output head (the last stage's), for the rows that want logits, kLogitRows at a time; the
    // final hidden states for the rows that want them: after the output norm, or (post-norm) x
    // itself, a run of rows bound for consecutive host rows in one copy (an encoder's pass).
    Backend &be = *stages.back().be;
    Workspace &w = *stages.back().w;
    if (output_norm_.empty())
        for (int t = 0, g; t < T; t += g) {
            g = 1;
            if (!rows[t].hidden) continue;
            while (t + g < T && rows[t + g].hidden == rows[t].hidden + (size_t)g * H) g++;
            be.download(rows[t].hidden, w.x + (size_t)t * H, sizeof(float) * H * g);
        }
    // A classifier's rows: the pooler over each row's hidden state, then the labels.
    const bool classify = !classifier_.empty();
    const int n_out = classify ? n_labels() : c.vocab_size;
    int wanted[kLogitRows];
    for (int t = 0; t < T;) {
        int n = 0;
        for (; t < T && n < kLogitRows; t++) {
            float *h = w.xb + (size_t)n * H;
            if (classify) {  // post-norm: x is the final hidden state (downloaded above)
                if (!rows[t].logits) continue;
                be.matmul(pooler_, pooler_bias_, w.x + (size_t)t * H, 1, h);
                be.act(Act::Tanh, h, (size_t)H, h);
            } else {
                if (output_norm_.empty() || (!rows[t].logits && !rows[t].hidden)) continue;
                be.norm(nk, eps, output_norm_, output_norm_bias_, w.x + (size_t)t * H, 1, H, h);
                if (rows[t].hidden) be.download(rows[t].hidden, h, sizeof(float) * H);
                if (!rows[t].logits) continue;
            }
            wanted[n++] = t;
        }
        if (n == 0) continue;
        if (classify) be.matmul(classifier_, classifier_bias_, w.xb, n, w.logits);
        else be.matmul(output_, Tensor{}, w.xb, n, w.logits);
        if (c.final_softcap > 0 && !classify) be.softcap(w.logits, (size_t)n * c.vocab_size, c.final_softcap);
        for (int i = 0; i < n; i++) be.download(rows[wanted[i]].logits, w.logits + (size_t)i * n_out, sizeof(float) * n_out);
    }
    finish_all();
    return true;
}

}  // namespace fastllm
