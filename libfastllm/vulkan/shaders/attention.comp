#version 450
// Causal attention, one query row and head per workgroup, over the keys of its own cache (several
// sessions' rows in one pass): keys in tiles of 64, one an invocation for the scores, with an online
// softmax (running maximum and sum). The weighted values go 4 an invocation, in G lanes of `span`
// invocations (a power of two >= head_dim / 4, at most 64), each lane taking every G-th key of a
// tile; the lanes' sums are added at the end. So every invocation loads values whatever the head's
// size (with one invocation a value, stories260K's heads of 8 left 56 of 64 idle), and keys, values
// and the query are read 4 values a step, 64 bits a load: lavapipe (Mesa 22) loads a component at a
// time, an invocation at a time, whatever its bytes. Accumulates in f32.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t q, out_, rows, blocks;  // rows: per row [position, first block, KV types]; blocks: [key row 0, value row 0] per block
    uint n_heads, n_kv, head_dim, window;
    float scale, softcap;
} p;
shared float score[64], lane_l[64];
shared vec4 lane_sum[128];

uint64_t block_row(uint b, uint which) {
    const uint i = (b * 2u + which) * 2u;
    return Words(p.blocks).v[i] | uint64_t(Words(p.blocks).v[i + 1u]) << 32;
}

// Values at + i .. at + i + 3 of a row of n-value heads: 64-bit loads where n % 4 == 0, else one at
// a time, 0 past the head's end.
vec4 head4(uint64_t row, uint type, uint at, uint i, uint n) {
    if (n % 4u == 0u) return kv_at4(row, type, at + i);
    vec4 v = vec4(0.0);
    for (uint k = 0u; k < 4u; k++)
        if (i + k < n) v[k] = kv_at(row, type, at + i + k);
    return v;
}

void main() {
    const uint r = gl_WorkGroupID.x, h = gl_WorkGroupID.y, hd = p.head_dim, tid = gl_LocalInvocationID.x;
    const uint pos = Words(p.rows).v[r * 4u], first_block = Words(p.rows).v[r * 4u + 1u], types = Words(p.rows).v[r * 4u + 2u];
    const uint type_k = types & 255u, type_v = types >> 8, kv_dim = p.n_kv * hd;
    const uint row_k = kv_row_bytes(type_k, kv_dim), row_v = kv_row_bytes(type_v, kv_dim);
    const uint kvh = h / (p.n_heads / p.n_kv), q_dim = p.n_heads * hd, q_at = r * q_dim + h * hd;
    uint span = 64u;
    while (span > 1u && span / 2u >= (hd + 3u) / 4u) span /= 2u;
    const uint G = 64u / span, lane = tid % span, grp = tid / span;
    const uint lo = p.window > 0u && pos + 1u > p.window ? pos + 1u - p.window : 0u;
    float m = -1.0 / 0.0, l = 0.0;
    vec4 acc[2] = vec4[2](vec4(0.0), vec4(0.0));  // values 4 * (lane + d * span) .. + 3 (head_dim <= 512)
    for (uint k0 = lo; k0 <= pos; k0 += 64u) {
        const uint j = k0 + tid;
        float s = -1.0 / 0.0;
        if (j <= pos) {
            const uint64_t krow = block_row(first_block + j / 32u, 0u) + uint64_t((j % 32u) * row_k);
            float dot_ = 0.0;
            for (uint i = 0u; i < hd; i += 4u) dot_ += dot(head4(p.q, KV_F32, q_at, i, hd), head4(krow, type_k, kvh * hd, i, hd));
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
        acc[0] *= corr, acc[1] *= corr;
        for (uint i = grp; i < n; i += G) {
            const float w = exp(score[i] - tmax);
            l += w;
            const uint jj = k0 + i;
            const uint64_t vrow = block_row(first_block + jj / 32u, 1u) + uint64_t((jj % 32u) * row_v);
            for (uint d = 0u; d < 2u; d++) {
                const uint e = 4u * (lane + d * span);
                if (e < hd) acc[d] += w * head4(vrow, type_v, kvh * hd, e, hd);
            }
        }
        m = tmax;
        barrier();
    }
    // the lanes' sums: each lane's l sums its own keys' weights
    lane_sum[tid * 2u] = acc[0], lane_sum[tid * 2u + 1u] = acc[1], lane_l[tid] = l;
    barrier();
    if (grp != 0u) return;
    float t = 0.0;
    for (uint g = 0u; g < G; g++) t += lane_l[g * span];
    for (uint d = 0u; d < 2u; d++) {
        const uint e = 4u * (lane + d * span);
        if (e >= hd) break;
        vec4 v = vec4(0.0);
        for (uint g = 0u; g < G; g++) v += lane_sum[(g * span + lane) * 2u + d];
        for (uint k = 0u; k < 4u; k++)
            if (e + k < hd) Floats(p.out_).v[q_at + e + k] = v[k] / t;
    }
}
