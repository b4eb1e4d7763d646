#version 450
// The activations a quantized matmul multiplies, as the CPU's kernels see them (cpu/ops_ref.cpp):
// per block of 32 of a row, d = max |x| / 127 and x -> d * round(x / d). One block per invocation.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t x, out_;
    uint blocks;  // of all T rows
} p;

void main() {
    const uint b = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
    if (b >= p.blocks) return;
    float amax = 0.0;
    for (uint i = 0u; i < 32u; i++) amax = max(amax, abs(Floats(p.x).v[b * 32u + i]));
    const float d = amax / 127.0, id = amax > 0.0 ? 127.0 / amax : 0.0;
    for (uint i = 0u; i < 32u; i++) Floats(p.out_).v[b * 32u + i] = d * roundEven(Floats(p.x).v[b * 32u + i] * id);
}
