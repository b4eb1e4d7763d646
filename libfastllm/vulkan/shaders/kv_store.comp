#version 450
// Writes rows into KV caches: workgroup (t, 0) row t's key, (t, 1) its value. The source rows are
// of type src_type (f32 from a pass's qkv, or a saved state's type), at src + t * src_stride bytes;
// the destinations, per row, two addresses (key, value; 0: not written).
#include "common.glsl"
layout(local_size_x = 64) in;
layout(push_constant) uniform Push {
    uint64_t src, dst;  // dst: per row, [key address, value address]
    uint src_stride, k_off, v_off, src_type, n, type_k, type_v;
} p;
#include "kv_row.glsl"

void main() {
    const uint t = gl_WorkGroupID.x, which = gl_WorkGroupID.y;
    const uint64_t dst = Words(p.dst).v[t * 4u + which * 2u] | uint64_t(Words(p.dst).v[t * 4u + which * 2u + 1u]) << 32;
    if (dst == 0ul) return;
    const uint64_t src = p.src + uint64_t(t) * p.src_stride + (which == 0u ? p.k_off : p.v_off);
    for (uint i = gl_LocalInvocationID.x; i < p.n; i += 64u) row[i] = kv_at(src, p.src_type, i);
    barrier();
    write_row(dst, which == 0u ? p.type_k : p.type_v, p.n);
}
