// A sum over the workgroup's 64 invocations (every one calls it, and gets the sum).
shared float reduce_buf[64];
float wg_sum(float v) {
    const uint tid = gl_LocalInvocationID.x;
    reduce_buf[tid] = v;
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) reduce_buf[tid] += reduce_buf[tid + s];
        barrier();
    }
    const float r = reduce_buf[0];
    barrier();
    return r;
}
