// The compute shaders' SPIR-V, compiled from vulkan/shaders/*.comp by glslc at build time
// (CMakeLists.txt) and embedded here.
#include "vulkan/vk_device.h"

namespace fastllm::vk {

namespace {
const uint32_t kMatmul[] =
#include "matmul.spv.h"
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
}  // namespace

const uint32_t *shader_code(Shader s, size_t *bytes) {
    struct Code {
        const uint32_t *code;
        size_t bytes;
    };
    static const Code table[(int)Shader::Count] = {
        {kMatmul, sizeof kMatmul}, {kEmbed, sizeof kEmbed},       {kNorm, sizeof kNorm},
        {kGlu, sizeof kGlu},       {kSoftcap, sizeof kSoftcap},   {kQkvRope, sizeof kQkvRope},
        {kKvStore, sizeof kKvStore}, {kKvShift, sizeof kKvShift}, {kAttention, sizeof kAttention},
        {kQuantize, sizeof kQuantize},
    };
    *bytes = table[(int)s].bytes;
    return table[(int)s].code;
}

}  // namespace fastllm::vk
