#version 450
// One head of one row per workgroup (slots: the n_heads query heads, then the n_kv key heads):
// the per-head norm (if given), then RoPE with the row's cos / sin. Query heads go to q, key heads
// back into qkv's k part, from where kv_store writes them to the cache.
#include "common.glsl"
#include "reduce.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t qkv, q, q_norm, k_norm, rope;  // rope: per row, the addresses of its cos and sin
    uint n_heads, n_kv, head_dim, layer_norm, rope_dim, interleaved;
    float eps;
} p;
shared float head[512];

void main() {
    const uint t = gl_WorkGroupID.x, slot = gl_WorkGroupID.y, hd = p.head_dim, tid = gl_LocalInvocationID.x;
    const uint q_dim = p.n_heads * hd, qkv_dim = q_dim + 2u * p.n_kv * hd;
    const bool is_q = slot < p.n_heads;
    const uint src = t * qkv_dim + (is_q ? slot * hd : q_dim + (slot - p.n_heads) * hd);
    for (uint i = tid; i < hd; i += 64u) head[i] = Floats(p.qkv).v[src + i];
    barrier();
    const uint64_t nw = is_q ? p.q_norm : p.k_norm;
    if (nw != 0ul) {
        float mean = 0.0;
        if (p.layer_norm != 0u) {
            float s = 0.0;
            for (uint i = tid; i < hd; i += 64u) s += head[i];
            mean = wg_sum(s) / float(hd);
        }
        float ss = 0.0;
        for (uint i = tid; i < hd; i += 64u) ss += (head[i] - mean) * (head[i] - mean);
        const float inv = inversesqrt(wg_sum(ss) / float(hd) + p.eps);
        for (uint i = tid; i < hd; i += 64u) head[i] = (head[i] - mean) * inv * Floats(nw).v[i];
        barrier();
    }
    const uint64_t cs = Words(p.rope).v[t * 4u] | uint64_t(Words(p.rope).v[t * 4u + 1u]) << 32;
    const uint64_t sn = Words(p.rope).v[t * 4u + 2u] | uint64_t(Words(p.rope).v[t * 4u + 3u]) << 32;
    const uint half_ = p.rope_dim / 2u;
    for (uint i = tid; i < half_; i += 64u) {
        const uint i0 = p.interleaved != 0u ? 2u * i : i, i1 = p.interleaved != 0u ? 2u * i + 1u : i + half_;
        const float a = head[i0], b = head[i1], c = Floats(cs).v[i], s = Floats(sn).v[i];
        head[i0] = a * c - b * s;
        head[i1] = b * c + a * s;
    }
    barrier();
    for (uint i = tid; i < hd; i += 64u) {
        if (is_q) Floats(p.q).v[t * q_dim + slot * hd + i] = head[i];
        else Floats(p.qkv).v[src + i] = head[i];
    }
}
