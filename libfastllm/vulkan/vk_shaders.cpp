// The compute shaders' SPIR-V, compiled from vulkan/shaders/*.comp by glslc at build time
// (CMakeLists.txt) and embedded here.
#include "vulkan/vk_device.h"

namespace fastllm::vk {

namespace {
const uint32_t kMatmul[] =
#include "matmul.spv.h"
    ;
const uint32_t kMatmulRows[] =
#include "matmul_rows.spv.h"
    ;
const uint32_t kMatmulQuant[] =
#include "matmul_quant.spv.h"
    ;
const uint32_t kEmbed[] =
#include "embed.spv.h"
    ;
const uint32_t kNorm[] =
#include "norm.spv.h"
    ;
const uint32_t kGlu[] =
#include "glu.spv.h"
    ;
const uint32_t kSoftcap[] =
#include "softcap.spv.h"
    ;
const uint32_t kQkvRope[] =
#include "qkv_rope.spv.h"
    ;
const uint32_t kKvStore[] =
#include "kv_store.spv.h"
    ;
const uint32_t kKvShift[] =
#include "kv_shift.spv.h"
    ;
const uint32_t kAttention[] =
#include "attention.spv.h"
    ;
const uint32_t kQuantize[] =
#include "quantize.spv.h"
    ;

struct Code {
    const uint32_t *code;
    size_t bytes;
    const char *name;
    bool by_dtype;  // specialised by a weight dtype (constant 0)
};
const Code &code_of(Shader s) {
    static const Code table[(int)Shader::Count] = {
        {kMatmul, sizeof kMatmul, "matmul", true},
        {kMatmulRows, sizeof kMatmulRows, "matmul_rows", true},
        {kMatmulQuant, sizeof kMatmulQuant, "matmul_quant", true},
        {kEmbed, sizeof kEmbed, "embed", true},
        {kNorm, sizeof kNorm, "norm", false},
        {kGlu, sizeof kGlu, "glu", false},
        {kSoftcap, sizeof kSoftcap, "softcap", false},
        {kQkvRope, sizeof kQkvRope, "qkv_rope", false},
        {kKvStore, sizeof kKvStore, "kv_store", false},
        {kKvShift, sizeof kKvShift, "kv_shift", false},
        {kAttention, sizeof kAttention, "attention", false},
        {kQuantize, sizeof kQuantize, "quantize", false},
    };
    return table[(int)s];
}
}  // namespace

const uint32_t *shader_code(Shader s, size_t *bytes) {
    *bytes = code_of(s).bytes;
    return code_of(s).code;
}
const char *shader_name(Shader s) { return code_of(s).name; }
bool shader_by_dtype(Shader s) { return code_of(s).by_dtype; }

}  // namespace fastllm::vk
