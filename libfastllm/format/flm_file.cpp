#include "format/flm_file.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "platform/platform.h"

namespace fastllm {

namespace {

const char kMagic[8] = {'F', 'A', 'S', 'T', 'L', 'L', 'M', '\0'};
// Bounds for counts and lengths, so a corrupted length cannot make us allocate absurd memory.
constexpr uint64_t kMaxEntries = 1u << 24;
constexpr uint64_t kMaxStringBytes = 1u << 26;

// Reads little-endian fields from [data, data+size); every read is bounds-checked.
class Cursor {
public:
    Cursor(const uint8_t *data, uint64_t size, const std::string &path) : data_(data), size_(size), path_(path) {}

    uint64_t pos() const { return pos_; }
    void need(uint64_t n, const char *what) {
        if (n > size_ - pos_)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: truncated file: %s needs %llu bytes at offset %llu, file has %llu",
                 path_.c_str(), what, (unsigned long long)n, (unsigned long long)pos_, (unsigned long long)size_);
    }
    template <typename T>
    T read(const char *what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }
    uint64_t count(const char *what) {
        uint64_t n = read<uint64_t>(what);
        if (n > kMaxEntries)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s has an implausible count %llu", path_.c_str(), what,
                 (unsigned long long)n);
        return n;
    }
    std::string string(const char *what) {
        uint64_t n = read<uint64_t>(what);
        if (n > kMaxStringBytes)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: %s has an implausible length %llu", path_.c_str(), what,
                 (unsigned long long)n);
        need(n, what);
        std::string s((const char *)data_ + pos_, n);
        pos_ += n;
        return s;
    }

private:
    const uint8_t *data_;
    uint64_t size_;
    uint64_t pos_ = 0;
    const std::string &path_;
};

}  // namespace

FlmFile::FlmFile(const std::string &path, bool use_mmap) : path_(path) {
    const platform::FileBytes f = platform::read_file(path, use_mmap, kAlignment);
    if (f.size == 0) fail(FASTLLM_ERR_BAD_FORMAT, "%s: empty file, not a .flm model", path.c_str());
    bytes_ = f.data, size_ = f.size, mapped_ = f.mapped;
    try {
        parse();
    } catch (...) {
        release();  // the destructor does not run for a constructor that throws
        throw;
    }
}

FlmFile::FlmFile(const std::string &name, const void *data, uint64_t size) : path_(name), size_(size) {
    if (size_ == 0) fail(FASTLLM_ERR_BAD_FORMAT, "%s: empty buffer, not a .flm model", name.c_str());
    void *buf = platform::aligned_alloc(kAlignment, size_);
    if (!buf)
        fail(FASTLLM_ERR_OUT_OF_MEMORY, "cannot allocate %llu bytes for '%s'", (unsigned long long)size_, name.c_str());
    std::memcpy(buf, data, size_);
    bytes_ = (const uint8_t *)buf;
    try {
        parse();
    } catch (...) {
        release();
        throw;
    }
}

FlmFile::~FlmFile() { release(); }

void FlmFile::release() {
    if (!bytes_) return;
    platform::release_file(platform::FileBytes{bytes_, size_, mapped_});
    bytes_ = nullptr;
}

void FlmFile::parse() {
    const char *p = path_.c_str();
    Cursor c(bytes_, size_, path_);
    c.need(8, "magic");
    if (std::memcmp(bytes_, kMagic, 8) != 0) fail(FASTLLM_ERR_BAD_FORMAT, "%s: not a .flm file (bad magic)", p);
    c.read<uint64_t>("magic");
    const uint32_t version = c.read<uint32_t>("version");
    if (version < 1 || version > kVersion)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: unsupported .flm version %u (this library reads versions 1 to %u)", p,
             version, kVersion);
    kind_ = c.read<uint32_t>("kind");
    if (kind_ > kKindAdapter)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: unknown .flm file kind %u (0: a model, 1: a LoRA adapter)", p, kind_);
    uint64_t n_meta = c.count("metadata count");
    uint64_t n_tensors = c.count("tensor count");
    uint64_t data_offset = c.read<uint64_t>("data offset");
    if (data_offset % kAlignment != 0 || data_offset > size_)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: data offset %llu is not 64-aligned or lies past the end (%llu bytes)", p,
             (unsigned long long)data_offset, (unsigned long long)size_);

    for (uint64_t i = 0; i < n_meta; i++) {
        std::string key = c.string("metadata key");
        MetaValue v;
        uint32_t type = c.read<uint32_t>("metadata type");
        switch (type) {
        case MetaValue::I64: v.i = c.read<int64_t>("i64 value"); break;
        case MetaValue::F64: v.f = c.read<double>("f64 value"); break;
        case MetaValue::STRING: v.s = c.string("string value"); break;
        case MetaValue::I64_ARRAY: {
            uint64_t n = c.count("i64 array");
            c.need(n * 8, "i64 array");
            v.ints.resize(n);
            for (auto &x : v.ints) x = c.read<int64_t>("i64 array");
            break;
        }
        case MetaValue::F32_ARRAY: {
            uint64_t n = c.count("f32 array");
            c.need(n * 4, "f32 array");
            v.floats.resize(n);
            for (auto &x : v.floats) x = c.read<float>("f32 array");
            break;
        }
        case MetaValue::STRING_ARRAY: {
            uint64_t n = c.count("string array");
            c.need(n * 8, "string array");
            v.strings.resize(n);
            for (auto &x : v.strings) x = c.string("string array element");
            break;
        }
        default:
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: metadata '%s' has unknown type %u", p, key.c_str(), type);
        }
        v.type = (MetaValue::Type)type;
        if (!meta_.emplace(key, std::move(v)).second)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: duplicate metadata key '%s'", p, key.c_str());
    }

    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [start, end) of each tensor, to find overlaps
    for (uint64_t i = 0; i < n_tensors; i++) {
        Tensor t;
        t.name = c.string("tensor name");
        const char *tn = t.name.c_str();
        uint32_t dtype = c.read<uint32_t>("tensor dtype");
        if (!dtype_is_known(dtype)) fail(FASTLLM_ERR_UNSUPPORTED, "%s: tensor '%s' has unknown dtype %u", p, tn, dtype);
        t.dtype = (DType)dtype;
        uint32_t n_dims = c.read<uint32_t>("tensor dims");
        if (n_dims < 1 || n_dims > 4) fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' has %u dims (1..4 allowed)", p, tn, n_dims);
        t.n_dims = (int)n_dims;
        uint64_t elements = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t dim = c.read<uint64_t>("tensor shape");
            if (dim == 0 || dim > (1ull << 40) || elements > (1ull << 40) / dim)
                fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' has an invalid dimension %llu", p, tn, (unsigned long long)dim);
            elements *= dim;
            t.dims[d] = (int64_t)dim;
        }
        uint64_t offset = c.read<uint64_t>("tensor offset");
        uint64_t n_bytes = c.read<uint64_t>("tensor size");
        if (dtype_is_quantized(t.dtype) && version < 2)  // version 1 stored quantized rows one after another
            fail(FASTLLM_ERR_UNSUPPORTED, "%s: tensor '%s' is quantized in the .flm version 1 layout; convert the model "
                 "again", p, tn);
        if (dtype_is_quantized(t.dtype) && (n_dims != 2 || t.dims[1] % dtype_row_multiple(t.dtype) != 0))
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: quantized tensor '%s' (%s) must be a matrix whose rows are a multiple of %d long",
                 p, tn, dtype_name(t.dtype), dtype_row_multiple(t.dtype));
        const uint64_t expected = tensor_bytes(t.dtype, (uint64_t)t.rows(), (uint64_t)t.cols());
        if (n_bytes != expected)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' has %llu bytes, its shape and dtype need %llu", p, tn,
                 (unsigned long long)n_bytes, (unsigned long long)expected);
        if (offset % kAlignment != 0)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' offset %llu is not 64-aligned", p, tn, (unsigned long long)offset);
        if (offset > size_ - data_offset || n_bytes > size_ - data_offset - offset)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor '%s' (offset %llu, %llu bytes) runs past the end of the file (%llu bytes)",
                 p, tn, (unsigned long long)(data_offset + offset), (unsigned long long)n_bytes, (unsigned long long)size_);
        t.data = bytes_ + data_offset + offset;
        ranges.emplace_back(data_offset + offset, data_offset + offset + n_bytes);
        if (!tensors_.emplace(t.name, t).second) fail(FASTLLM_ERR_BAD_FORMAT, "%s: duplicate tensor '%s'", p, tn);
    }
    if (c.pos() > data_offset)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: header and tables (%llu bytes) overlap the tensor data at %llu", p,
             (unsigned long long)c.pos(), (unsigned long long)data_offset);
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); i++)
        if (ranges[i].first < ranges[i - 1].second)
            fail(FASTLLM_ERR_BAD_FORMAT, "%s: tensor data overlap at offset %llu", p, (unsigned long long)ranges[i].first);
}

const MetaValue &FlmFile::find(const std::string &key, MetaValue::Type type) const {
    auto it = meta_.find(key);
    if (it == meta_.end()) fail(FASTLLM_ERR_BAD_FORMAT, "%s: missing metadata '%s'", path_.c_str(), key.c_str());
    if (it->second.type != type)
        fail(FASTLLM_ERR_BAD_FORMAT, "%s: metadata '%s' has type %u, expected %u", path_.c_str(), key.c_str(),
             (unsigned)it->second.type, (unsigned)type);
    return it->second;
}

int64_t FlmFile::get_int(const std::string &key) const { return find(key, MetaValue::I64).i; }
int64_t FlmFile::get_int(const std::string &key, int64_t fallback) const {
    return has(key) ? get_int(key) : fallback;
}
double FlmFile::get_float(const std::string &key) const { return find(key, MetaValue::F64).f; }
std::string FlmFile::get_string(const std::string &key, const std::string &fallback) const {
    return has(key) ? find(key, MetaValue::STRING).s : fallback;
}
const std::vector<int64_t> &FlmFile::get_ints(const std::string &key) const { return find(key, MetaValue::I64_ARRAY).ints; }
const std::vector<float> &FlmFile::get_floats(const std::string &key) const {
    return find(key, MetaValue::F32_ARRAY).floats;
}
const std::vector<std::string> &FlmFile::get_strings(const std::string &key) const {
    return find(key, MetaValue::STRING_ARRAY).strings;
}

const Tensor &FlmFile::tensor(const std::string &name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) fail(FASTLLM_ERR_BAD_FORMAT, "%s: missing tensor '%s'", path_.c_str(), name.c_str());
    return it->second;
}

}  // namespace fastllm
