// A KV row of n values (n even, <= 4096) in shared memory, written to the cache's type at dst
// (arch/kv_format.h): f32, f16 (two halves a word), q8 (per block of 32: a float scale, then 32
// codes; the last block zero-padded). Whole words only, so no two invocations share one.
shared float row[4096];

void write_row(uint64_t dst, uint type, uint n) {
    const uint tid = gl_LocalInvocationID.x;
    if (type == KV_F32) {
        for (uint i = tid; i < n; i += 64u) Floats(dst).v[i] = row[i];
    } else if (type == KV_F16) {
        for (uint w = tid; w < n / 2u; w += 64u) Words(dst).v[w] = half_bits(row[2u * w]) | half_bits(row[2u * w + 1u]) << 16;
    } else {
        for (uint b = tid; b * 32u < n; b += 64u) {
            const uint first = b * 32u, len = min(32u, n - first);
            float amax = 0.0;
            for (uint i = 0u; i < len; i++) amax = max(amax, abs(row[first + i]));
            const float d = amax / 127.0, id = amax > 0.0 ? 127.0 / amax : 0.0;
            Words(dst).v[b * 9u] = floatBitsToUint(d);
            for (uint w = 0u; w < 8u; w++) {
                uint word = 0u;
                for (uint k = 0u; k < 4u; k++) {
                    const uint i = w * 4u + k;
                    const int code = i < len ? int(roundEven(row[first + i] * id)) : 0;
                    word |= (uint(code) & 255u) << (8u * k);
                }
                Words(dst).v[b * 9u + 1u + w] = word;
            }
        }
    }
}
