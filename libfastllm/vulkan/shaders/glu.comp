#version 450
// The MLP's activation. Gated (a GLU): out[t] = act(gate[t]) * up[t], gate_up[t] = [gate (n) | up
// (n)]; else out[i] = act(x[i]) over n values in rows of 65,535 workgroups (out may be x).
// act: 0 silu, 1 gelu (tanh), 2 gelu (erf), 3 tanh: arch/decoder_config.h's Act.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t gate_up, out_;
    uint n, act, gated;
} p;

// erf by Abramowitz and Stegun 7.1.26 (|error| < 1.5e-7): GLSL has no erf.
float erf_(float x) {
    const float t = 1.0 / (1.0 + 0.3275911 * abs(x));
    const float y = 1.0 - t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))) * exp(-x * x);
    return x < 0.0 ? -y : y;
}

float act(float g) {
    if (p.act == 0u) return g / (1.0 + exp(-g));
    if (p.act == 1u) return 0.5 * g * (1.0 + tanh(clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0)));
    if (p.act == 2u) return 0.5 * g * (1.0 + erf_(g * 0.7071067811865476));
    return tanh(clamp(g, -15.0, 15.0));
}

void main() {
    if (p.gated == 0u) {
        const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
        if (i < p.n) Floats(p.out_).v[i] = act(Floats(p.gate_up).v[i]);
        return;
    }
    const uint i = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
    if (i >= p.n) return;
    const float g = Floats(p.gate_up).v[t * 2u * p.n + i], u = Floats(p.gate_up).v[t * 2u * p.n + p.n + i];
    Floats(p.out_).v[t * p.n + i] = act(g) * u;
}
