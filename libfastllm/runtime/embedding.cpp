#include "runtime/embedding.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "base/error.h"
#include "runtime/pass.h"

namespace fastllm {

namespace {
constexpr int kDefaultBatch = 512;
}  // namespace

const char *pooling_name(Pooling p) {
    switch (p) {
    case Pooling::None: return "none";
    case Pooling::Mean: return "mean";
    case Pooling::Cls: return "cls";
    case Pooling::Last: return "last";
    }
    return "?";
}

Pooling model_pooling(const Model &m) {
    const DecoderConfig &c = m.config();
    const std::string key = c.arch + ".pooling";
    if (!m.file().has(key)) return c.causal ? Pooling::Last : Pooling::Cls;
    const std::string v = m.file().get_string(key);
    for (Pooling p : {Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last})
        if (v == pooling_name(p)) return p;
    fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s '%s' is not none, mean, cls or last", m.file().path().c_str(), key.c_str(), v.c_str());
}

std::vector<int32_t> embed_tokens_of(const Model &m, const char *text, size_t len, bool add_special, bool truncate) {
    const Tokenizer &tok = m.tokenizer();
    const std::string_view s(text, len);
    std::vector<int32_t> ids = tok.encode(s, add_special);
    const size_t max = (size_t)m.config().context_length;
    if (ids.size() <= max) return ids;
    if (!truncate)
        fail(FASTLLM_ERR_CONTEXT_FULL, "an input of %zu tokens is longer than the model's %zu (truncate cuts it)",
             ids.size(), max);
    if (!add_special) return std::vector<int32_t>(ids.begin(), ids.begin() + max);
    // The special tokens around the text: where its own encoding sits inside the full one.
    const std::vector<int32_t> body = tok.encode(s, false);
    size_t at = 0;
    while (at + body.size() <= ids.size() && !std::equal(body.begin(), body.end(), ids.begin() + at)) at++;
    const size_t specials = ids.size() - body.size();
    if (at + body.size() > ids.size() || specials >= max) return std::vector<int32_t>(ids.begin(), ids.begin() + max);
    std::vector<int32_t> out(ids.begin(), ids.begin() + at);
    out.insert(out.end(), body.begin(), body.begin() + (max - specials));
    out.insert(out.end(), ids.begin() + at + body.size(), ids.end());
    return out;
}

void embed(const Model &m, const std::vector<std::vector<int32_t>> &inputs, const EmbedOptions &o, float *out) {
    const DecoderConfig &c = m.config();
    const size_t H = (size_t)c.hidden_size;
    size_t longest = 0;
    for (const auto &in : inputs) {
        if (in.empty()) fail(FASTLLM_ERR_INVALID_ARGUMENT, "an input has no tokens");
        if (in.size() > (size_t)c.context_length)
            fail(FASTLLM_ERR_CONTEXT_FULL, "an input of %zu tokens is longer than the model's context (%d)", in.size(),
                 c.context_length);
        m.check_token_ids(in.data(), in.size());
        longest = std::max(longest, in.size());
    }
    // An encoder sees a whole input in one pass: a pass holds at least the longest.
    int capacity = o.n_batch > 0 ? o.n_batch : kDefaultBatch;
    if (!c.causal) capacity = std::max(capacity, (int)longest);
    capacity = std::min(capacity, std::max((int)longest, 1) * (int)inputs.size());
    Compute &compute = m.compute(o.n_threads > 0 ? o.n_threads : m.n_threads());
    // Exact keys for an encoder's short inputs; a decoder's long ones take half (as a session's default).
    const KvType kv = c.causal ? KvType::F16 : KvType::F32;
    const std::vector<Memory *> memory = compute.kv_memory(c.num_layers);

    std::vector<float> hidden;  // the rows of the inputs in the pass, [rows, H]
    std::vector<std::unique_ptr<KvCache>> caches;
    size_t row_out = 0;  // Pooling::None: the next output row
    std::lock_guard<std::mutex> lock(compute.mutex);
    compute.reserve(m.decoder(), capacity, c.context_length);
    for (size_t first = 0; first < inputs.size();) {
        // The inputs of this pass: as many as fit (a decoder's input may run over several passes).
        size_t end = first, rows = 0;
        while (end < inputs.size() && (end == first || rows + inputs[end].size() <= (size_t)capacity))
            rows += inputs[end++].size();
        hidden.assign(rows * H, 0.0f);
        caches.clear();
        std::vector<size_t> offset;  // each input's first row in `hidden`
        for (size_t i = first; i < end; i++) {
            const int n = (int)inputs[i].size();
            caches.push_back(std::make_unique<KvCache>(c.num_layers, (n + KvCache::kBlock - 1) / KvCache::kBlock * KvCache::kBlock,
                                                       c.kv_dim(), kv, kv, c.window, false, 0, memory));
            caches.back()->prepare(0, n);
            offset.push_back(i == first ? 0 : offset.back() + inputs[i - 1].size());
        }
        Pass pass(m.decoder(), compute, capacity);
        for (size_t i = first; i < end; i++) {
            const std::vector<int32_t> &in = inputs[i];
            const bool all = o.pooling == Pooling::None || o.pooling == Pooling::Mean;
            for (size_t t = 0; t < in.size(); t++) {
                const bool want = all || (o.pooling == Pooling::Cls && t == 0) || (o.pooling == Pooling::Last && t + 1 == in.size());
                pass.add(*caches[i - first], (int)t, in[t], nullptr, want ? &hidden[(offset[i - first] + t) * H] : nullptr);
            }
        }
        pass.flush();
        for (size_t i = first; i < end; i++) {
            const float *h = &hidden[offset[i - first] * H];
            const size_t n = inputs[i].size();
            if (o.pooling == Pooling::None) {
                std::memcpy(out + row_out * H, h, sizeof(float) * n * H);
                row_out += n;
                continue;
            }
            float *v = out + i * H;
            if (o.pooling == Pooling::Mean) {
                std::vector<double> sum(H, 0.0);
                for (size_t t = 0; t < n; t++)
                    for (size_t j = 0; j < H; j++) sum[j] += h[t * H + j];
                for (size_t j = 0; j < H; j++) v[j] = (float)(sum[j] / (double)n);
            } else {
                std::memcpy(v, h + (o.pooling == Pooling::Cls ? 0 : n - 1) * H, sizeof(float) * H);
            }
        }
        first = end;
    }
    if (o.normalize) {
        const size_t n_vec = o.pooling == Pooling::None ? row_out : inputs.size();
        for (size_t i = 0; i < n_vec; i++) {
            float *v = out + i * H;
            double ss = 0;
            for (size_t j = 0; j < H; j++) ss += (double)v[j] * v[j];
            const double inv = 1.0 / std::max(std::sqrt(ss), 1e-12);  // as torch's F.normalize
            for (size_t j = 0; j < H; j++) v[j] = (float)(v[j] * inv);
        }
    }
}

}  // namespace fastllm
