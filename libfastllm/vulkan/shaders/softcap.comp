#version 450
// x[i] = cap * tanh(x[i] / cap).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t x;
    uint n;
    float cap;
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
    if (i < p.n) Floats(p.x).v[i] = soft_cap(Floats(p.x).v[i], p.cap);
}
