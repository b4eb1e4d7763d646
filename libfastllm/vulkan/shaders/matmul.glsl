// matmul.glsl — what the matmul shaders share (matmul.comp: a decode row, matmul_rows.comp: a pass
// of several rows, both of an F32, F16 or BF16 W; matmul_quant.comp: a quantized W):
// y[T, N] = x[T, K] . W[N, K]^T (+ bias), a workgroup of 64 computing OUTS outputs n (16, a tile,
// for matmul_quant) for a block of ROWS rows, its weights specialised by dtype (constant 0).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint DTYPE = 0u;
layout(push_constant) uniform Push {
    Matrix w;
    uint64_t bias, x, y;
    uint T;
} p;
const uint ROWS = 8u, OUTS = 8u;

// Output n of row t, its bias added (one invocation calls it).
void store(uint t, uint n, float v) {
    if (p.bias != 0ul) v += Floats(p.bias).v[n];
    Floats(p.y).v[t * p.w.rows + n] = v;
}
