#version 450
// A context shift: per position (workgroup), its key row read, rotated by the shift's cos / sin
// and written at its new place, and its value row copied. The host runs positions in chunks
// that never write a row another workgroup of the same dispatch reads.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t moves, cs, sn;  // moves: per position, [key from, key to, value from, value to]
    uint n_kv, head_dim, rope_dim, interleaved, type_k, n, v_words;
} p;
#include "kv_row.glsl"

uint64_t move(uint i) { return Words(p.moves).v[i * 2u] | uint64_t(Words(p.moves).v[i * 2u + 1u]) << 32; }

void main() {
    const uint m = gl_WorkGroupID.x * 4u, tid = gl_LocalInvocationID.x;
    const uint64_t kf = move(m), kt = move(m + 1u), vf = move(m + 2u), vt = move(m + 3u);
    for (uint i = tid; i < p.n; i += 64u) row[i] = kv_at(kf, p.type_k, i);
    for (uint w = tid; w < p.v_words; w += 64u) Words(vt).v[w] = Words(vf).v[w];
    barrier();
    const uint half_ = p.rope_dim / 2u;
    for (uint j = tid; j < p.n_kv * half_; j += 64u) {
        const uint h = j / half_, i = j % half_, base = h * p.head_dim;
        const uint i0 = base + (p.interleaved != 0u ? 2u * i : i), i1 = base + (p.interleaved != 0u ? 2u * i + 1u : i + half_);
        const float a = row[i0], b = row[i1], c = Floats(p.cs).v[i], s = Floats(p.sn).v[i];
        row[i0] = a * c - b * s;
        row[i1] = b * c + a * s;
    }
    barrier();
    write_row(kt, p.type_k, p.n);
}
