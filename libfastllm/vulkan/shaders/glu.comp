#version 450
// out[t] = act(gate[t]) * up[t], gate_up[t] = [gate (n) | up (n)]; act: silu or gelu (tanh).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t gate_up, out_;
    uint n, gelu;
} p;

void main() {
    const uint i = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
    if (i >= p.n) return;
    const float g = Floats(p.gate_up).v[t * 2u * p.n + i], u = Floats(p.gate_up).v[t * 2u * p.n + p.n + i];
    float a;
    if (p.gelu != 0u) a = 0.5 * g * (1.0 + tanh(clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0)));
    else a = g / (1.0 + exp(-g));
    Floats(p.out_).v[t * p.n + i] = a * u;
}
