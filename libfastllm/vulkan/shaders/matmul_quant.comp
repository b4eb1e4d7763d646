#version 450
// y[T, N] = x[T, K] . W[N, K]^T (+ bias) for a quantized W, every pass (matmul.comp and
// matmul_rows.comp take f32, f16 and bf16). A workgroup takes one tile of 16 weight rows (the
// layout of cpu/tile_layout.h) for a block of up to 8 rows of x: its 64 invocations are 4 lanes of
// 4 weight rows each, times 16 slices of K (a decode row: 64 slices of all 16 rows). A chunk of the
// tile holds 4 columns of its 16 rows, a row's 4 codes in one word, so a lane reads 4 words side by
// side (the 4 lanes of a slice the chunk's 64 bytes), its rows' scales once a group, and each
// activation once for its 4 rows; the slices' sums are added in shared memory at the end, in a
// fixed order. lavapipe (Mesa 22) loads a component at a time, an invocation at a time, whatever its
// bytes: with weight_at's code and scale a product, SmolLM2-135M int4's 4 decoded tokens took 9.2 s
// there, now 1.7-2.1 s. Accumulates in f32.
#include "matmul.glsl"
const uint R = 4u, SLICES = 16u;  // weight rows a lane; slices of K
shared float part[SLICES * ROWS * 16u];

void main() {
    const uint tile = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint t0 = gl_WorkGroupID.z * ROWS, nt = min(ROWS, p.T - t0), K = p.w.cols;
    const uint id = gl_LocalInvocationID.x, lane = id % 4u, slice = id / 4u, r0 = tile * 16u + lane * R;
    const uint bits = dtype_bits(DTYPE), G = dtype_group(DTYPE);
    const float offset = dtype_has_min(DTYPE) ? 0.0 : float(1u << (bits - 1u));
    const uint64_t codes = tile_codes_base(p.w, tile);
    if (p.T == 1u) {
        // A decode row: an invocation a slice of K for all 16 rows, so that each activation it loads
        // serves 16 (SmolLM2-135M int8's decoding matmuls on lavapipe 3.2-3.6 -> 2.1-2.4 ms a
        // dispatch); the sums of a pass of rows would not fit its registers.
        const uint n4 = K / 4u, per = (n4 + 63u) / 64u, c_end = min(n4, (id + 1u) * per);
        float a16[16];
        for (uint i = 0u; i < 16u; i++) a16[i] = 0.0;
        uint g_at = ~0u;
        vec4 sc[4], mn4[4];
        for (uint c4 = id * per; c4 < c_end; c4++) {
            const uint c = c4 * 4u;
            if (c / G != g_at) {
                g_at = c / G;
                for (uint h = 0u; h < 4u; h++) group_scales4(DTYPE, p.w, tile * 16u + 4u * h, g_at, sc[h], mn4[h]);
            }
            const vec4 x = floats4_at(p.x, c);
            for (uint h = 0u; h < 4u; h++) {
                const uvec4 q = tile_codes16(codes, bits, 4u * h, c);
                for (uint i = 0u; i < 4u; i++)
                    a16[4u * h + i] += dot((bytes4(q[i]) - offset) * sc[h][i] + mn4[h][i], x);
            }
        }
        for (uint i = 0u; i < 16u; i++) part[id * 16u + i] = a16[i];
        barrier();
        if (id < 16u) {
            float v = 0.0;
            for (uint s = 0u; s < 64u; s++) v += part[s * 16u + id];
            if (tile * 16u + id < p.w.rows) store(0u, tile * 16u + id, v);
        }
        return;
    }
    float acc[R * ROWS];
    for (uint i = 0u; i < R * ROWS; i++) acc[i] = 0.0;
    const uint n4 = K / 4u, per = (n4 + SLICES - 1u) / SLICES, c_end = min(n4, (slice + 1u) * per);  // K: 32s
    uint g_at = ~0u;
    vec4 scale, mn;
    for (uint c4 = slice * per; c4 < c_end; c4++) {
        const uint c = c4 * 4u;
        if (c / G != g_at) {
            g_at = c / G;
            group_scales4(DTYPE, p.w, r0, g_at, scale, mn);
        }
        const uvec4 q = tile_codes16(codes, bits, lane * R, c);
        vec4 w[R];
        for (uint i = 0u; i < R; i++)
            w[i] = (bytes4(q[i]) - offset) * scale[i] + mn[i];
        for (uint j = 0u; j < ROWS; j++) {
            if (j >= nt) break;
            const vec4 x = floats4_at(p.x, (t0 + j) * K + c);
            for (uint i = 0u; i < R; i++) acc[j * R + i] += dot(w[i], x);
        }
    }
    for (uint j = 0u; j < ROWS; j++) {
        if (j >= nt) break;
        for (uint i = 0u; i < R; i++) part[(slice * ROWS + j) * 16u + lane * R + i] = acc[j * R + i];
    }
    barrier();
    for (uint e = id; e < nt * 16u; e += 64u) {
        const uint j = e / 16u, l = e % 16u, n = tile * 16u + l;
        float v = 0.0;
        for (uint s = 0u; s < SLICES; s++) v += part[(s * ROWS + j) * 16u + l];
        if (n < p.w.rows) store(t0 + j, n, v);
    }
}
