#version 450
// y[T, N] = x[T, K] . W[N, K]^T (+ bias). A workgroup computes 8 outputs n for a block of 8 rows;
// each subgroup takes outputs in turn, its invocations striding over K (reads of a weight row side
// by side) and summing with subgroupAdd, so no barrier is needed whatever the subgroup size (8 on
// lavapipe, 32 on NVIDIA, 64 on AMD). Each weight is read once for the block's rows (a GEMV for a
// decode row, weight reuse for a prompt). Accumulates in f32.
#include "matmul.glsl"

void main() {
    const uint block = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint t0 = gl_WorkGroupID.z * ROWS, nt = min(ROWS, p.T - t0), K = p.w.cols;
    for (uint o = gl_SubgroupID; o < OUTS; o += gl_NumSubgroups) {
        const uint n = block * OUTS + o;
        if (n >= p.w.rows) break;
        float acc[ROWS];
        for (uint j = 0u; j < ROWS; j++) acc[j] = 0.0;
        if (nt == 1u) {  // a decode row: the loop without the rows' bookkeeping
            const uint64_t xr = p.x + uint64_t(t0) * K * 4u;
            for (uint c = gl_SubgroupInvocationID; c < K; c += gl_SubgroupSize)
                acc[0] += weight_at(DTYPE, p.w, n, c) * Floats(xr).v[c];
        } else {
            for (uint c = gl_SubgroupInvocationID; c < K; c += gl_SubgroupSize) {
                const float w = weight_at(DTYPE, p.w, n, c);
                for (uint j = 0u; j < ROWS; j++)
                    if (j < nt) acc[j] += w * Floats(p.x).v[(t0 + j) * K + c];
            }
        }
        for (uint j = 0u; j < ROWS; j++) {
            if (j >= nt) break;
            const float v = subgroupAdd(acc[j]);
            if (subgroupElect()) store(t0 + j, n, v);
        }
    }
}
