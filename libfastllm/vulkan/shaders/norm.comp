#version 450
// One row per workgroup. Plain norm (d == 0): out = norm(x) by w, b. The residual add (d != 0):
// d = norm(d) by post_w (if given); x += d; out = norm(x) by w, b (if w is given). Rms: x / rms(x)
// * w; Layer: (x - mean) / std(x) * w + b. Each invocation keeps to its own elements, so out may be d.
#include "common.glsl"
#include "reduce.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t x, d, post_w, w, b, out_;
    uint n, layer_norm;
    float eps;
} p;

// The factors (mean, 1 / std or 1 / rms) of a row.
vec2 stats(uint64_t row, uint off) {
    float mean = 0.0;
    if (p.layer_norm != 0u) {
        float s = 0.0;
        for (uint i = gl_LocalInvocationID.x; i < p.n; i += 64u) s += Floats(row).v[off + i];
        mean = wg_sum(s) / float(p.n);
    }
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < p.n; i += 64u) {
        const float v = Floats(row).v[off + i] - mean;
        ss += v * v;
    }
    return vec2(mean, inversesqrt(wg_sum(ss) / float(p.n) + p.eps));
}

void main() {
    const uint off = gl_WorkGroupID.x * p.n, tid = gl_LocalInvocationID.x;
    if (p.d != 0ul) {
        if (p.post_w != 0ul) {
            const vec2 f = stats(p.d, off);
            for (uint i = tid; i < p.n; i += 64u)
                Floats(p.d).v[off + i] = (Floats(p.d).v[off + i] - f.x) * f.y * Floats(p.post_w).v[i];
        }
        for (uint i = tid; i < p.n; i += 64u) Floats(p.x).v[off + i] += Floats(p.d).v[off + i];
        if (p.w == 0ul) return;
    }
    const vec2 f = stats(p.x, off);
    for (uint i = tid; i < p.n; i += 64u) {
        float v = (Floats(p.x).v[off + i] - f.x) * f.y * Floats(p.w).v[i];
        if (p.b != 0ul) v += Floats(p.b).v[i];
        Floats(p.out_).v[off + i] = v;
    }
}
