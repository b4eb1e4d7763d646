// lora.h — LoRA adapters as the forward pass applies them: y = W x + s B (A x) for each adapted
// part of a layer's four matrices, unmerged (the base weights stay as they are, of any dtype), for
// the rows of a pass whose session has the adapter set (ForwardRow::lora).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arch/kv_format.h"
#include "format/flm_file.h"
#include "format/tensor.h"

namespace fastllm {

class Decoder;

// The matrices of a layer an adapter can change, in the order the forward pass runs them.
enum LoraMatrix : int { kLoraQkv = 0, kLoraAttnOutput = 1, kLoraGateUp = 2, kLoraDown = 3, kLoraMatrices = 4 };

// n rows of len values each, of a KV row type (kv_format.h), every stride bytes: how a backend
// reads an adapter's matrices, with the kernels that read the KV cache (the same sums: rows dotted
// with a vector, rows added with weights).
struct LoraRows {
    const void *data = nullptr;
    size_t stride = 0;
    KvType type = KvType::F32;
    int n = 0;
    int64_t len = 0;
};

// Rows [row0, row0 + bt.len) of a base matrix get s * b (a x): a [r, cols of W] and b (the file's
// [rows, r], the adapter's own scale alpha / r folded in by the converter) held transposed, bt
// [r, rows]: b (a x) is then r scaled adds of bt's rows, whole vectors, where b's own rows are dot
// products only r long (110M shape, 8 sessions with 8 rank-16 adapters on every matrix: f32 0.70x
// of the no-adapter decode rate with b's rows, 0.74x with bt's; f16 0.77x and 0.81x, the bound of
// the bytes a step reads). In f32 or f16 as the file has them, or q8 (adapter.dtype "q8").
struct LoraPart {
    LoraRows a, bt;
    int64_t row0 = 0;
};

// An adapter file, checked against a model's decoder: every tensor is a known part of one of
// its layers' matrices, of the right shape. Throws Error (FASTLLM_ERR_BAD_FORMAT for a file that
// is not an adapter or does not fit; FASTLLM_ERR_UNSUPPORTED for what the pass cannot apply).
class LoraAdapter {
public:
    LoraAdapter(std::unique_ptr<FlmFile> file, const Decoder &decoder);
    const std::vector<LoraPart> &parts(int layer, int matrix) const { return layers_[(size_t)layer][(size_t)matrix]; }
    const std::string &name() const { return name_; }
    const std::string &path() const { return file_->path(); }
    int max_rank() const { return max_rank_; }
    const Decoder &decoder() const { return *decoder_; }  // the model's it was checked against
    // Identifies the adapter (a saved state names the adapters it was computed with): a hash of its
    // tensor table and every tensor's bytes.
    uint64_t fingerprint() const { return fingerprint_; }

private:
    // A matrix as the pass reads it: in place, or (transposed, as q8) in memory the adapter owns.
    LoraRows rows_of(const Tensor &t, bool transposed, KvType type);

    std::unique_ptr<FlmFile> file_;
    const Decoder *decoder_;
    std::string name_;
    std::vector<std::array<std::vector<LoraPart>, kLoraMatrices>> layers_;
    std::vector<std::unique_ptr<char[]>> owned_;       // bt, and q8 rows
    int max_rank_ = 0;
    uint64_t fingerprint_ = 0;
};

// A session's adapters and their scales (immutable once made; sessions share it by pointer).
struct LoraSet {
    std::vector<std::pair<std::shared_ptr<const LoraAdapter>, float>> entries;
};

}  // namespace fastllm
