#version 450
// y[1, N] = x[1, K] . W[N, K]^T (+ bias), a decode row, for an F32, F16 or BF16 W (matmul_rows.comp
// takes a pass of several rows, matmul_quant.comp a quantized W). A workgroup computes 8 outputs; a
// subgroup takes OG of them at once, its invocations striding over K 4 columns at a time (a weight
// row read side by side, 64 bits a load, each activation serving OG rows) and summing with
// subgroupAdd, so no barrier is needed whatever the subgroup size (8 on lavapipe, 32 on NVIDIA, 64 on
// AMD). lavapipe (Mesa 22) loads a component at a time, an invocation at a time, whatever its bytes:
// one 32-bit column an invocation gave SmolLM2-135M f32's decode matmuls 7.4 s of device time for 4
// tokens, 64-bit loads 5.0 s, then 4 outputs a subgroup 3.6 s. Accumulates in f32.
#include "matmul.glsl"
const uint OG = 4u;  // outputs a subgroup takes at once

void main() {
    const uint block = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, K = p.w.cols;
    for (uint o0 = gl_SubgroupID * OG; o0 < OUTS; o0 += gl_NumSubgroups * OG) {
        const uint n0 = block * OUTS + o0;
        if (n0 >= p.w.rows) break;
        const uint ng = min(OG, p.w.rows - n0);
        float acc[OG];
        for (uint g = 0u; g < OG; g++) acc[g] = 0.0;
        // A row not of whole 64-bit loads: a column at a time (a loop of its own: a branch in every
        // load of one loop made the matmuls 1.25x slower on lavapipe).
        if (K % 4u != 0u) {
            for (uint c = gl_SubgroupInvocationID; c < K; c += gl_SubgroupSize) {
                const float x = Floats(p.x).v[c];
                for (uint g = 0u; g < OG; g++)
                    if (g < ng) acc[g] += weight_at(DTYPE, p.w, n0 + g, c) * x;
            }
        } else {
            for (uint c = gl_SubgroupInvocationID * 4u; c < K; c += gl_SubgroupSize * 4u) {
                const vec4 x = floats4_at(p.x, c);
                for (uint g = 0u; g < OG; g++)
                    if (g < ng) acc[g] += dot(weights4_at(DTYPE, p.w, n0 + g, c), x);
            }
        }
        for (uint g = 0u; g < OG; g++) {
            if (g >= ng) break;
            const float v = subgroupAdd(acc[g]);
            if (subgroupElect()) store(0u, n0 + g, v);
        }
    }
}
