#version 450
// y[T, N] = x[T, K] . W[N, K]^T (+ bias) for a pass of several rows and an F32, F16 or BF16 W
// (matmul.comp takes a decode row, matmul_quant.comp a quantized W): a workgroup computes 8 outputs
// n for a block of 8 rows, its subgroups' invocations striding over K 4 columns at a time (64 bits a
// load) and summing with subgroupAdd; a subgroup takes OG outputs at once, so that each activation it
// loads serves OG weight rows. On lavapipe a load, not its bytes, is what costs (a cached
// activation's as much as a streamed weight's: FASTLLM_VULKAN_PROFILE), and with one output at a
// time 8 of a block's 9 loads were activations: SmolLM2-135M's 19-token prompt 14.2-15.4 -> 6.0-7.0 s;
// then 64-bit loads its matmuls' device time 5.6 -> 3.4 s. A decode row stays on matmul.comp: the
// rows' 32 sums and their loop made stories260K's decoding matmuls 1.5x slower here. Accumulates in
// f32.
#include "matmul.glsl"
const uint OG = 4u;  // outputs a subgroup takes at once

void main() {
    const uint block = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint t0 = gl_WorkGroupID.z * ROWS, nt = min(ROWS, p.T - t0), K = p.w.cols;
    for (uint o0 = gl_SubgroupID * OG; o0 < OUTS; o0 += gl_NumSubgroups * OG) {
        const uint n0 = block * OUTS + o0;
        if (n0 >= p.w.rows) break;
        const uint ng = min(OG, p.w.rows - n0);
        float acc[OG * ROWS];
        for (uint i = 0u; i < OG * ROWS; i++) acc[i] = 0.0;
        // A row not of whole 64-bit loads: a column at a time (a loop of its own: a branch in every
        // load of one loop made the matmuls 1.25x slower on lavapipe).
        if (K % 4u != 0u) {
            for (uint c = gl_SubgroupInvocationID; c < K; c += gl_SubgroupSize) {
                float w[OG];
                for (uint g = 0u; g < OG; g++) w[g] = g < ng ? weight_at(DTYPE, p.w, n0 + g, c) : 0.0;
                for (uint j = 0u; j < ROWS; j++) {
                    if (j >= nt) break;
                    const float x = Floats(p.x).v[(t0 + j) * K + c];
                    for (uint g = 0u; g < OG; g++) acc[g * ROWS + j] += w[g] * x;
                }
            }
        } else {
            for (uint c = gl_SubgroupInvocationID * 4u; c < K; c += gl_SubgroupSize * 4u) {
                vec4 w[OG];
                for (uint g = 0u; g < OG; g++) w[g] = g < ng ? weights4_at(DTYPE, p.w, n0 + g, c) : vec4(0.0);
                for (uint j = 0u; j < ROWS; j++) {
                    if (j >= nt) break;
                    const vec4 x = floats4_at(p.x, (t0 + j) * K + c);
                    for (uint g = 0u; g < OG; g++) acc[g * ROWS + j] += dot(w[g], x);
                }
            }
        }
        for (uint g = 0u; g < OG; g++) {
            if (g >= ng) break;
            for (uint j = 0u; j < ROWS; j++) {
                if (j >= nt) break;
                const float v = subgroupAdd(acc[g * ROWS + j]);
                if (subgroupElect()) store(t0 + j, n0 + g, v);
            }
        }
    }
}
