#version 450
// x[t] = row tokens[t] of E * scale.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint DTYPE = 0u;
layout(push_constant) uniform Push {
    Matrix e;
    uint64_t tokens, x;
    float scale;
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y, H = p.e.cols;
    if (i >= H) return;
    const uint token = Words(p.tokens).v[t];
    Floats(p.x).v[t * H + i] = weight_at(DTYPE, p.e, token, i) * p.scale;
}
