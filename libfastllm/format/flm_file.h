// flm_file.h — opens a .flm file (docs/flm_format.md), validates every field against the file
// size, and exposes the metadata and zero-copy tensor views into the mapped bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/tensor.h"

namespace fastllm {

struct MetaValue {
    enum Type : uint32_t { I64 = 1, F64 = 2, STRING = 3, I64_ARRAY = 4, F32_ARRAY = 5, STRING_ARRAY = 6 };
    Type type = I64;
    int64_t i = 0;
    double f = 0;
    std::string s;
    std::vector<int64_t> ints;
    std::vector<float> floats;
    std::vector<std::string> strings;
};

class FlmFile {
public:
    // 3: per-architecture metadata for every family (2: LLaMA only; its keys are read unchanged);
    // 2: quantized rows in tiles of 16 (1: row by row)
    static constexpr uint32_t kVersion = 3;
    static constexpr uint64_t kAlignment = 64;
    // The header's file kind (the u32 after the version, 0 before adapters existed).
    static constexpr uint32_t kKindModel = 0, kKindAdapter = 1;

    // Throws Error (FASTLLM_ERR_IO / FASTLLM_ERR_BAD_FORMAT) naming the check that failed.
    FlmFile(const std::string &path, bool use_mmap);
    // A copy of the size bytes at data (into aligned memory this object owns), called name in
    // messages; the same checks.
    FlmFile(const std::string &name, const void *data, uint64_t size);
    ~FlmFile();
    FlmFile(const FlmFile &) = delete;
    FlmFile &operator=(const FlmFile &) = delete;

    const std::string &path() const { return path_; }
    uint64_t size() const { return size_; }
    bool mapped() const { return mapped_; }
    uint32_t kind() const { return kind_; }

    bool has(const std::string &key) const { return meta_.count(key) != 0; }
    // Typed getters throw FASTLLM_ERR_BAD_FORMAT when the key is missing or has another type.
    int64_t get_int(const std::string &key) const;
    int64_t get_int(const std::string &key, int64_t fallback) const;
    double get_float(const std::string &key) const;
    std::string get_string(const std::string &key, const std::string &fallback = "") const;
    const std::vector<int64_t> &get_ints(const std::string &key) const;
    const std::vector<float> &get_floats(const std::string &key) const;
    const std::vector<std::string> &get_strings(const std::string &key) const;

    bool has_tensor(const std::string &name) const { return tensors_.count(name) != 0; }
    // Throws FASTLLM_ERR_BAD_FORMAT if missing.
    const Tensor &tensor(const std::string &name) const;
    const std::map<std::string, Tensor> &tensors() const { return tensors_; }

private:
    const MetaValue &find(const std::string &key, MetaValue::Type type) const;
    void parse();
    void release();

    std::string path_;
    uint64_t size_ = 0;
    const uint8_t *bytes_ = nullptr;
    bool mapped_ = false;
    uint32_t kind_ = kKindModel;
    std::map<std::string, MetaValue> meta_;
    std::map<std::string, Tensor> tensors_;
};

}  // namespace fastllm
