#include "arch/lora.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "arch/decoder.h"
#include "base/error.h"
#include "base/fnv.h"

namespace fastllm {

namespace {

constexpr const char *kMatrixNames[kLoraMatrices] = {"attn_qkv", "attn_output", "ffn_gate_up", "ffn_down"};

// "blk.L.NAME.weight.lora_X.ROW0" -> layer, matrix, X ('a' or 'b'), row0; false for any other name.
// A decimal of 1 to 12 digits at s (no sign): its value, and where it ends; false otherwise. Names
// are a file's: no overflow, whatever they say (a layer or row above 10^12 is refused by the checks).
bool parse_number(const char *s, int64_t &value, const char *&end) {
    value = 0;
    end = s;
    while (*end >= '0' && *end <= '9' && end - s < 12) value = value * 10 + (*end++ - '0');
    return end != s && !(*end >= '0' && *end <= '9');
}

bool parse_name(const std::string &name, int &layer, int &matrix, char &which, int64_t &row0) {
    if (name.compare(0, 4, "blk.") != 0) return false;
    int64_t l = 0;
    const char *end = nullptr;
    if (!parse_number(name.c_str() + 4, l, end) || *end != '.' || l > (1 << 20)) return false;
    const std::string rest(end + 1);
    for (int m = 0; m < kLoraMatrices; m++) {
        const std::string head = std::string(kMatrixNames[m]) + ".weight.lora_";
        if (rest.compare(0, head.size(), head) != 0 || rest.size() < head.size() + 3) continue;
        const char x = rest[head.size()];
        if ((x != 'a' && x != 'b') || rest[head.size() + 1] != '.') return false;
        int64_t r0 = 0;
        const char *tail = nullptr;
        if (!parse_number(rest.c_str() + head.size() + 2, r0, tail) || *tail != '\0') return false;
        layer = (int)l, matrix = m, which = x, row0 = r0;
        return true;
    }
    return false;
}

// The other matrix of a part (a name parse_name took): "...lora_a.ROW0" <-> "...lora_b.ROW0".
std::string partner(const std::string &name) {
    std::string other = name;
    const size_t at = other.rfind(".lora_") + 6;
    other[at] = other[at] == 'a' ? 'b' : 'a';
    return other;
}

}  // namespace

LoraRows LoraAdapter::rows_of(const Tensor &t, bool transposed, KvType type) {
    LoraRows r;
    r.type = type;
    r.n = (int)(transposed ? t.cols() : t.rows());
    r.len = transposed ? t.rows() : t.cols();
    if (!transposed && type != KvType::Q8) {  // read in place
        r.data = t.data, r.stride = t.row_bytes();
        return r;
    }
    r.stride = kv_row_bytes(type, (int)r.len);
    owned_.emplace_back(new char[r.stride * (size_t)r.n]);
    char *dst = owned_.back().get();
    r.data = dst;
    const size_t size = dtype_size(t.dtype);
    std::vector<float> row(type == KvType::Q8 ? (size_t)r.len : 0);
    for (int i = 0; i < r.n; i++) {
        char *out = type == KvType::Q8 ? (char *)row.data() : dst + (size_t)i * r.stride;
        for (int64_t j = 0; j < r.len; j++)  // element (i, j) of the matrix as read: t's (j, i) if transposed
            std::memcpy(out + (size_t)j * size, (const char *)t.data + (size_t)(transposed ? j * t.cols() + i : i * t.cols() + j) * size, size);
        if (type != KvType::Q8) continue;
        for (float v : row)  // a code of inf or NaN is no number: refused, as a damaged file
            if (!std::isfinite(v)) fail(FASTLLM_ERR_BAD_FORMAT, "%s: '%s' holds a value that is not finite", path().c_str(), t.name.c_str());
        kv_q8_store_row(row.data(), (int)r.len, dst + (size_t)i * r.stride);
    }
    return r;
}

LoraAdapter::LoraAdapter(std::unique_ptr<FlmFile> file, const Decoder &decoder)
    : file_(std::move(file)), decoder_(&decoder) {
    const char *path = file_->path().c_str();
    const DecoderConfig &c = decoder.config();
    if (file_->kind() != FlmFile::kKindAdapter)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s is a model, not a LoRA adapter (convert one with convert.py --adapter)", path);
    const std::string arch = file_->get_string("general.architecture"), type = file_->get_string("adapter.type", "");
    if (type != "lora") fail(FASTLLM_ERR_UNSUPPORTED, "%s: adapter type '%s' (only lora)", path, type.c_str());
    if (arch != c.arch)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s is an adapter for a %s model; this model is %s", path, arch.c_str(), c.arch.c_str());
    if (!c.causal) fail(FASTLLM_ERR_UNSUPPORTED, "%s: LoRA adapters of an encoder are not supported", path);
    name_ = file_->get_string("adapter.name", "");
    // The matrices' type at run time: the file's (f32 or f16), or "q8": f32 in the file, rows of
    // 32-value blocks in memory (convert.py --adapter ... --dtype int8: 0.56x the bytes of f16).
    const std::string dtype = file_->get_string("adapter.dtype", "");
    if (dtype != "" && dtype != "q8")
        fail(FASTLLM_ERR_UNSUPPORTED, "%s: adapter.dtype '%s' (this version knows q8)", path, dtype.c_str());
    layers_.resize((size_t)c.num_layers);
    for (const auto &kv : file_->tensors()) {
        int layer = 0, m = 0;
        char which = 0;
        int64_t row0 = 0;
        if (!parse_name(kv.first, layer, m, which, row0))
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' is not a LoRA part of a layer's matrix", path, kv.first.c_str());
        const std::string other = partner(kv.first);
        if (!file_->has_tensor(other))
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: '%s' has no '%s'", path, kv.first.c_str(), other.c_str());
        if (which == 'b') continue;  // checked with its a
        if (layer >= c.num_layers)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' is for layer %d; the model has %d", path, kv.first.c_str(), layer,
                 c.num_layers);
        const Tensor &a = kv.second, &b = file_->tensor(other), &w = decoder.matrix(layer, m);
        for (const Tensor *t : {&a, &b}) {
            if (t->n_dims != 2 || (t->dtype != DType::F32 && t->dtype != DType::F16))
                fail(FASTLLM_ERR_BAD_FORMAT, "%s: '%s' is not an f32 or f16 matrix", path, t->name.c_str());
            if (dtype == "q8" && t->dtype != DType::F32)
                fail(FASTLLM_ERR_BAD_FORMAT, "%s: '%s' is %s; a q8 adapter's matrices are f32 in the file", path,
                     t->name.c_str(), dtype_name(t->dtype));
        }
        // each matrix read as its own type (a part's a and b may differ), or q8
        auto type_of = [&](const Tensor &t) { return dtype == "q8" ? KvType::Q8 : t.dtype == DType::F16 ? KvType::F16 : KvType::F32; };
        const int64_t r = a.rows();
        if (r < 1 || a.cols() != w.cols() || b.cols() != r || b.rows() > w.rows() || row0 > w.rows() - b.rows())
            fail(FASTLLM_ERR_BAD_FORMAT,
                 "%s: '%s' [%lld, %lld] and its b [%lld, %lld] at row %lld do not fit the model's %s [%lld, %lld] "
                 "(an adapter of another model?)",
                 path, kv.first.c_str(), (long long)a.rows(), (long long)a.cols(), (long long)b.rows(), (long long)b.cols(),
                 (long long)row0, w.name.c_str(), (long long)w.rows(), (long long)w.cols());
        // A backend keeps a row's a x in scratch of the model's longest matrix row (Backend::lora).
        if (r > decoder.max_row_length())
            fail(FASTLLM_ERR_UNSUPPORTED, "%s: '%s' has rank %lld; this model takes at most rank %lld", path,
                 kv.first.c_str(), (long long)r, (long long)decoder.max_row_length());
        layers_[(size_t)layer][(size_t)m].push_back(LoraPart{rows_of(a, false, type_of(a)), rows_of(b, true, type_of(b)), row0});
        max_rank_ = std::max(max_rank_, (int)r);
    }
    if (max_rank_ == 0) fail(FASTLLM_ERR_BAD_FORMAT, "%s: the adapter has no LoRA matrices", path);
    Fnv1a f;  // all of it: an adapter is small (rank 16 on a 1B model: tens of MB, a few ms a MB)
    if (!dtype.empty()) f.add(dtype.c_str(), dtype.size() + 1);  // q8 rows compute other values than f32
    for (const auto &kv : file_->tensors()) {
        const Tensor &t = kv.second;
        f.add(kv.first.data(), kv.first.size() + 1);
        f.add_value((uint32_t)t.dtype);
        for (int d = 0; d < t.n_dims; d++) f.add_value(t.dims[d]);
        f.add(t.data, (size_t)t.n_elements() * dtype_size(t.dtype));
    }
    fingerprint_ = f.h;
}

}  // namespace fastllm
