#include "runtime/embedding.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

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

namespace {

// One input of a pass: its ids, and (a pair) its token types.
struct Input {
    std::vector<int32_t> ids, types;
};

// Where input i's row t goes: its hidden state and its logits (nullptr: not needed).
using RowTargets = std::function<void(size_t i, size_t t, float **hidden, float **logits)>;

// Runs the inputs in passes of up to n_batch rows (an encoder's input whole in one pass), each
// its own run of rows with a short-lived KV cache.
void run_inputs(const Model &m, const std::vector<Input> &inputs, int n_threads, int n_batch, const RowTargets &rows) {
    const DecoderConfig &c = m.config();
    size_t longest = 0;
    for (const Input &in : inputs) {
        if (in.ids.empty()) fail(FASTLLM_ERR_INVALID_ARGUMENT, "an input has no tokens");
        if (in.ids.size() > (size_t)c.context_length)
            fail(FASTLLM_ERR_CONTEXT_FULL, "an input of %zu tokens is longer than the model's context (%d)", in.ids.size(),
                 c.context_length);
        m.check_token_ids(in.ids.data(), in.ids.size());
        longest = std::max(longest, in.ids.size());
    }
    // An encoder sees a whole input in one pass: a pass holds at least the longest.
    int capacity = n_batch > 0 ? n_batch : kDefaultBatch;
    if (!c.causal) capacity = std::max(capacity, (int)longest);
    capacity = (int)std::min<int64_t>(capacity, (int64_t)std::max<size_t>(longest, 1) * (int64_t)inputs.size());
    Compute &compute = m.compute(n_threads > 0 ? n_threads : m.n_threads());
    // Exact keys for an encoder's short inputs; a decoder's long ones take half (as a session's default).
    const KvType kv = c.causal ? KvType::F16 : KvType::F32;
    const std::vector<Memory *> memory = compute.kv_memory(c.num_layers);
    std::vector<std::unique_ptr<KvCache>> caches;
    std::lock_guard<std::mutex> lock(compute.mutex);
    compute.reserve(m.decoder(), capacity);
    for (size_t first = 0; first < inputs.size();) {
        // The inputs of this pass: as many as fit (a decoder's input may run over several passes).
        size_t end = first, n_rows = 0;
        while (end < inputs.size() && (end == first || n_rows + inputs[end].ids.size() <= (size_t)capacity))
            n_rows += inputs[end++].ids.size();
        caches.clear();
        for (size_t i = first; i < end; i++) {
            const int n = (int)inputs[i].ids.size();
            caches.push_back(std::make_unique<KvCache>(c.num_layers, (n + KvCache::kBlock - 1) / KvCache::kBlock * KvCache::kBlock,
                                                       c.kv_dim(), kv, kv, c.window, false, 0, memory));
            caches.back()->prepare(0, n);
        }
        Pass pass(m.decoder(), compute, capacity);
        for (size_t i = first; i < end; i++) {
            const Input &in = inputs[i];
            for (size_t t = 0; t < in.ids.size(); t++) {
                float *hidden = nullptr, *logits = nullptr;
                rows(i, t, &hidden, &logits);
                pass.add(*caches[i - first], (int)t, in.ids[t], logits, hidden, in.types.empty() ? 0 : in.types[t]);
            }
        }
        pass.flush();
        first = end;
    }
}

}  // namespace

void embed(const Model &m, const std::vector<std::vector<int32_t>> &ids, const EmbedOptions &o, float *out) {
    const size_t H = (size_t)m.config().hidden_size;
    std::vector<Input> inputs(ids.size());
    for (size_t i = 0; i < inputs.size(); i++) inputs[i].ids = ids[i];
    // The rows each input keeps (mean and none: all of them; cls and last: one), at kept[i].
    const bool all = o.pooling == Pooling::None || o.pooling == Pooling::Mean;
    std::vector<size_t> kept(inputs.size() + 1, 0);
    for (size_t i = 0; i < inputs.size(); i++) kept[i + 1] = kept[i] + (all ? inputs[i].ids.size() : 1);
    std::vector<float> hidden(kept.back() * H);
    run_inputs(
        m, inputs, o.n_threads, o.n_batch,
        [&](size_t i, size_t t, float **h, float **) {
            const size_t n = inputs[i].ids.size();
            if (all) *h = &hidden[(kept[i] + t) * H];
            else if ((o.pooling == Pooling::Cls && t == 0) || (o.pooling == Pooling::Last && t + 1 == n)) *h = &hidden[kept[i] * H];
        });
    size_t row_out = 0;  // Pooling::None: the next output row
    for (size_t i = 0; i < inputs.size(); i++) {
        const float *h = &hidden[kept[i] * H];
        const size_t n = inputs[i].ids.size();
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
            std::memcpy(v, h, sizeof(float) * H);
        }
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

namespace {
// tokenizers' LongestFirst truncation of a pair to max ids (the special tokens not counted).
void truncate_pair(std::vector<int32_t> &a, std::vector<int32_t> &b, size_t max) {
    size_t n1 = a.size(), n2 = b.size();
    if (n1 + n2 <= max) return;
    const bool swap = n1 > n2;
    if (swap) std::swap(n1, n2);
    n2 = n1 > max ? n1 : std::max(n1, max - n1);
    if (n1 + n2 > max) {
        n1 = max / 2;
        n2 = n1 + max % 2;
    }
    if (swap) std::swap(n1, n2);
    a.resize(std::min(a.size(), n1));
    b.resize(std::min(b.size(), n2));
}
}  // namespace

namespace {
// A template's {instruction}, {query} and {document} filled in, in one pass (a query holding
// "{document}" stays as it is).
std::string fill(const std::string &tmpl, std::string_view instruction, std::string_view query, std::string_view document) {
    std::string out;
    for (size_t i = 0; i < tmpl.size();) {
        bool done = false;
        for (auto [name, value] : {std::pair<std::string_view, std::string_view>{"{instruction}", instruction},
                                   {"{query}", query}, {"{document}", document}})
            if (tmpl.compare(i, name.size(), name) == 0) {
                out += value;
                i += name.size();
                done = true;
                break;
            }
        if (!done) out += tmpl[i++];
    }
    return out;
}

int32_t single_token(const Model &m, const std::string &key) {
    const std::string text = m.file().get_string(key);
    const std::vector<int32_t> ids = m.tokenizer().encode(text, false);
    if (ids.size() != 1)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s '%s' is %zu tokens, not one", m.file().path().c_str(), key.c_str(), text.c_str(),
             ids.size());
    return ids[0];
}

// A decoder reranker: p(yes) against p(no) at the end of its prompt.
void rerank_decoder(const Model &m, std::string_view query, const std::vector<std::string_view> &documents,
                    const RerankOptions &o, float *scores) {
    const std::string a = m.config().arch + ".rerank.";
    const FlmFile &f = m.file();
    const int32_t yes = single_token(m, a + "yes"), no = single_token(m, a + "no");
    const std::string tmpl = f.get_string(a + "template"), own = f.get_string(a + "instruction", "");
    const std::string_view instruction = o.instruction ? std::string_view(o.instruction) : std::string_view(own);
    const size_t V = (size_t)m.config().vocab_size, max = (size_t)m.config().context_length;
    std::vector<Input> inputs(documents.size());
    for (size_t i = 0; i < documents.size(); i++) {
        inputs[i].ids = m.tokenizer().encode(fill(tmpl, instruction, query, documents[i]), m.tokenizer().add_bos_default());
        if (inputs[i].ids.size() > max)  // the prompt's end is the question: nothing to cut
            fail(FASTLLM_ERR_CONTEXT_FULL, "document %zu's prompt is %zu tokens, more than the model's %zu", i,
                 inputs[i].ids.size(), max);
    }
    // A whole vocabulary of logits per document, of which two are read: 16 documents at a time
    // (Qwen3: 9.7 MB), however many a request brings.
    constexpr size_t kChunk = 16;
    std::vector<float> logits(std::min(kChunk, documents.size()) * V);
    for (size_t first = 0; first < inputs.size(); first += kChunk) {
        const std::vector<Input> part(inputs.begin() + first, inputs.begin() + std::min(inputs.size(), first + kChunk));
        run_inputs(m, part, o.n_threads, o.n_batch, [&](size_t i, size_t t, float **, float **l) {
            if (t + 1 == part[i].ids.size()) *l = &logits[i * V];
        });
        for (size_t i = 0; i < part.size(); i++) scores[first + i] = logits[i * V + yes] - logits[i * V + no];
    }
}

// A cross-encoder: the classifier over [CLS] of each pair.
void rerank_cross_encoder(const Model &m, std::string_view query, const std::vector<std::string_view> &documents,
                          const RerankOptions &o, float *scores) {
    const Decoder &d = m.decoder();
    const Tokenizer &tok = m.tokenizer();
    if (d.n_labels() != 1)
        fail(FASTLLM_ERR_UNSUPPORTED, "%s cannot rerank: that needs a cross-encoder (an encoder with a one-label "
             "classifier head) or a decoder reranker (rerank keys, converted with --reranker)%s", m.file().path().c_str(),
             d.n_labels() > 1 ? (", and its classifier has " + std::to_string(d.n_labels()) + " labels").c_str() : "");
    if (m.config().n_token_types < 2)  // the document's tokens are of type 1
        fail(FASTLLM_ERR_UNSUPPORTED, "%s cannot rerank: a cross-encoder needs two token types, it has %d",
             m.file().path().c_str(), m.config().n_token_types);
    if (tok.bos_id() < 0 || tok.sep_id() < 0)
        fail(FASTLLM_ERR_UNSUPPORTED, "%s: its tokenizer has no [CLS] / [SEP] to join a query and a document", m.file().path().c_str());
    const std::vector<int32_t> q = tok.encode(query, false);
    const size_t max = (size_t)m.config().context_length;
    std::vector<Input> inputs(documents.size());
    for (size_t i = 0; i < documents.size(); i++) {
        std::vector<int32_t> a = q, b = tok.encode(documents[i], false);
        if (a.size() + b.size() + 3 > max) {
            if (!o.truncate || max < 4)
                fail(FASTLLM_ERR_CONTEXT_FULL, "document %zu and the query are %zu tokens, more than the model's %zu (truncate cuts them)",
                     i, a.size() + b.size() + 3, max);
            truncate_pair(a, b, max - 3);
        }
        Input &in = inputs[i];
        in.ids.push_back(tok.bos_id());
        in.ids.insert(in.ids.end(), a.begin(), a.end());
        in.ids.push_back(tok.sep_id());
        in.types.assign(in.ids.size(), 0);
        in.ids.insert(in.ids.end(), b.begin(), b.end());
        in.ids.push_back(tok.sep_id());
        in.types.resize(in.ids.size(), 1);
    }
    run_inputs(
        m, inputs, o.n_threads, o.n_batch,
        [&](size_t i, size_t t, float **, float **logits) {
            if (t == 0) *logits = &scores[i];  // the classifier over [CLS]
        });
}
}  // namespace

void rerank(const Model &m, std::string_view query, const std::vector<std::string_view> &documents,
            const RerankOptions &o, float *scores) {
    if (documents.empty()) fail(FASTLLM_ERR_INVALID_ARGUMENT, "no documents to rerank");
    if (m.decoder().has_lm_head() && m.file().has(m.config().arch + ".rerank.template"))
        rerank_decoder(m, query, documents, o, scores);
    else
        rerank_cross_encoder(m, query, documents, o, scores);
    if (o.normalize)
        for (size_t i = 0; i < documents.size(); i++) scores[i] = (float)(1.0 / (1.0 + std::exp(-(double)scores[i])));
}

}  // namespace fastllm
