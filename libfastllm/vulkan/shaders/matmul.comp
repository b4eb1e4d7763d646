#version 450
// y[T, N] = x[T, K] . W[N, K]^T (+ bias): one workgroup per output column n and block of 8 rows,
// its 64 invocations striding over K, so each weight is read once for the 8 rows (a GEMV for a
// decode row, weight reuse for a prompt). Accumulates in f32.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint DTYPE = 0u;
layout(push_constant) uniform Push {
    Matrix w;
    uint64_t bias, x, y;
    uint T;
} p;
const uint ROWS = 8u;
shared float partial[ROWS][64];

void main() {
    const uint n = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (n >= p.w.rows) return;  // the whole workgroup
    const uint t0 = gl_WorkGroupID.z * ROWS, nt = min(ROWS, p.T - t0), K = p.w.cols, tid = gl_LocalInvocationID.x;
    float acc[ROWS];
    for (uint j = 0u; j < ROWS; j++) acc[j] = 0.0;
    for (uint c = tid; c < K; c += 64u) {
        const float w = weight_at(DTYPE, p.w, n, c);
        for (uint j = 0u; j < ROWS; j++)
            if (j < nt) acc[j] += w * Floats(p.x).v[(t0 + j) * K + c];
    }
    for (uint j = 0u; j < ROWS; j++) partial[j][tid] = acc[j];
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s)
            for (uint j = 0u; j < ROWS; j++) partial[j][tid] += partial[j][tid + s];
        barrier();
    }
    if (tid < nt) {
        float v = partial[tid][0];
        if (p.bias != 0ul) v += Floats(p.bias).v[n];
        Floats(p.y).v[(t0 + tid) * p.w.rows + n] = v;
    }
}
