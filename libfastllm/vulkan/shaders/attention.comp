#version 450
// Causal attention, one query row and head per workgroup, over the keys of its own cache (several
// sessions' rows in one pass): keys in tiles of 64, one per invocation, with an online softmax
// (running maximum and sum), the output dimensions split over the invocations. A head of at most 32
// values is split by key as well, so that every invocation loads values: with one invocation a
// value, stories260K's 8 left 56 of 64 idle, and the value loads were two thirds of its attention's
// device time on lavapipe (FASTLLM_VULKAN_PROFILE; 1.7-1.8 s -> 0.4-0.85 s for 60 tokens). Accumulates in f32.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t q, out_, rows, blocks;  // rows: per row [position, first block, KV types]; blocks: [key row 0, value row 0] per block
    uint n_heads, n_kv, head_dim, window;
    float scale, softcap;
} p;
shared float qs[512];
shared float score[64];

uint64_t block_row(uint b, uint which) {
    const uint i = (b * 2u + which) * 2u;
    return Words(p.blocks).v[i] | uint64_t(Words(p.blocks).v[i + 1u]) << 32;
}

void main() {
    const uint r = gl_WorkGroupID.x, h = gl_WorkGroupID.y, hd = p.head_dim, tid = gl_LocalInvocationID.x;
    const uint pos = Words(p.rows).v[r * 4u], first_block = Words(p.rows).v[r * 4u + 1u], types = Words(p.rows).v[r * 4u + 2u];
    const uint type_k = types & 255u, type_v = types >> 8, kv_dim = p.n_kv * hd;
    const uint row_k = kv_row_bytes(type_k, kv_dim), row_v = kv_row_bytes(type_v, kv_dim);
    const uint kvh = h / (p.n_heads / p.n_kv), q_dim = p.n_heads * hd;
    // The weighted values' split: G lanes of span invocations (a power of two >= hd, at most 64), each
    // lane taking every G-th key of a tile; the lanes' sums are added at the end.
    uint span = 64u;
    while (span > 1u && span / 2u >= hd) span /= 2u;
    const uint G = 64u / span, lane = tid % span, grp = tid / span;
    for (uint i = tid; i < hd; i += 64u) qs[i] = Floats(p.q).v[r * q_dim + h * hd + i];
    barrier();
    const uint lo = p.window > 0u && pos + 1u > p.window ? pos + 1u - p.window : 0u;
    float m = -1.0 / 0.0, l = 0.0, acc[8];
    for (uint d = 0u; d < 8u; d++) acc[d] = 0.0;
    for (uint k0 = lo; k0 <= pos; k0 += 64u) {
        const uint j = k0 + tid;
        float s = -1.0 / 0.0;
        if (j <= pos) {
            const uint64_t krow = block_row(first_block + j / 32u, 0u) + uint64_t((j % 32u) * row_k);
            float dot_ = 0.0;
            for (uint i = 0u; i < hd; i++) dot_ += qs[i] * kv_at(krow, type_k, kvh * hd + i);
            s = dot_ * p.scale;
            if (p.softcap > 0.0) s = soft_cap(s, p.softcap);
        }
        score[tid] = s;
        barrier();
        const uint n = min(64u, pos + 1u - k0);
        float tmax = m;
        for (uint i = 0u; i < n; i++) tmax = max(tmax, score[i]);
        const float corr = exp(m - tmax);  // 0 on the first tile (m = -inf)
        l *= corr;
        for (uint d = 0u; d < 8u; d++) acc[d] *= corr;
        if (G > 1u) {  // a head of at most 32 values: lanes of span invocations take every G-th key
            for (uint i = grp; i < n; i += G) {
                const float w = exp(score[i] - tmax);
                l += w;
                const uint jj = k0 + i;
                const uint64_t vrow = block_row(first_block + jj / 32u, 1u) + uint64_t((jj % 32u) * row_v);
                if (lane < hd) acc[0] += w * kv_at(vrow, type_v, kvh * hd + lane);
            }
        } else {
            for (uint i = 0u; i < n; i++) {
                const float w = exp(score[i] - tmax);
                l += w;
                const uint jj = k0 + i;
                const uint64_t vrow = block_row(first_block + jj / 32u, 1u) + uint64_t((jj % 32u) * row_v);
                for (uint d = 0u; d < 8u; d++) {
                    const uint e = tid + d * 64u;
                    if (e < hd) acc[d] += w * kv_at(vrow, type_v, kvh * hd + e);
                }
            }
        }
        m = tmax;
        barrier();
    }
    if (G > 1u) {  // the lanes' sums (each lane's l: its own keys' weights)
        score[tid] = acc[0];
        qs[tid] = l;
        barrier();
        if (grp == 0u && lane < hd) {
            float v = 0.0, t = 0.0;
            for (uint g = 0u; g < G; g++) v += score[g * span + lane], t += qs[g * span];
            Floats(p.out_).v[r * q_dim + h * hd + lane] = v / t;
        }
        return;
    }
    for (uint d = 0u; d < 8u; d++) {
        const uint e = tid + d * 64u;
        if (e < hd) Floats(p.out_).v[r * q_dim + h * hd + e] = acc[d] / l;
    }
}
