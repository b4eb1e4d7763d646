// common.glsl — what every shader shares: buffers reached by device address (the addresses the
// Vulkan backend's Memory hands out are Vulkan buffer device addresses, so the host's pointer
// arithmetic in them is the shaders' too), read as 32-bit words so that no 8- or 16-bit storage
// feature is needed, and the element readers of weights and KV rows.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Floats { float v[]; };

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Pairs { uint64_t v[]; };

// Floats i..i+3 (i % 4 == 0) as two 64-bit loads: lavapipe (Mesa 22) loads a vector one component
// at a time, each an invocation at a time, so two 64-bit components cost half of four 32-bit ones.
vec4 floats4_at(uint64_t base, uint i) {
    const uvec2 a = unpackUint2x32(Pairs(base).v[i >> 1]), b = unpackUint2x32(Pairs(base).v[(i >> 1) + 1u]);
    return uintBitsToFloat(uvec4(a, b));
}
// Halves i..i+3 (i % 4 == 0) as f32, one 64-bit load.
vec4 halves4_at(uint64_t base, uint i) {
    const uvec2 w = unpackUint2x32(Pairs(base).v[i >> 2]);
    return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
}

float f16_at(uint64_t base, uint i) {
    const uint w = Words(base).v[i >> 1];
    return unpackHalf2x16((i & 1u) != 0u ? w >> 16 : w).x;
}
uint byte_at(uint64_t base, uint i) { return (Words(base).v[i >> 2] >> ((i & 3u) * 8u)) & 255u; }

// The dtypes of format/tensor.h.
const uint F32 = 0u, F16 = 1u, BF16 = 2u, Q8 = 3u, Q4_32 = 4u, Q4_64 = 5u, Q4_128 = 6u, Q4M_32 = 7u, Q6 = 8u,
           Q4K = 9u, Q6K = 10u, Q3K = 11u, Q5K = 12u;

// A matrix [rows, cols] of any dtype: its address, and for quantized ones what format/tensor.h
// and cpu/tile_layout.h derive from its shape (computed by the host, so the two cannot differ).
struct Matrix {
    uint64_t base;
    uint rows, cols;
    uint scales_bytes;  // quant_scales_bytes: the codes start there
    uint tile_bytes;    // quant_tile_bytes
};

uint dtype_bits(uint t) {
    if (t == Q8) return 8u;
    if (t == Q6 || t == Q6K) return 6u;
    if (t == Q3K) return 3u;
    if (t == Q5K) return 5u;
    return 4u;
}
uint dtype_group(uint t) { return t == Q4_64 ? 64u : t == Q4_128 ? 128u : 32u; }
bool dtype_has_min(uint t) { return t == Q4M_32 || t == Q4K || t == Q3K || t == Q5K; }
bool dtype_k_scales(uint t) { return t >= Q4K; }

// The 4 words at byte `at` (a multiple of 8) as two 64-bit loads.
uvec4 words4_at(uint64_t base, uint at) {
    return uvec4(unpackUint2x32(Pairs(base).v[at >> 3]), unpackUint2x32(Pairs(base).v[(at >> 3) + 1u]));
}

// The stored codes of lanes i0..i0+3 (i0 % 4 == 0), columns c..c+3 (c % 4 == 0) of a tile's codes,
// a lane's four a word, one a byte (cpu/tile_layout.h's tile_code sixteen at once: a chunk holds
// lane i's four columns as the word at i * 4, and a 3-, 5- or 6-bit code's high bits sit at the
// same place in words of their own).
uvec4 tile_codes16(uint64_t codes, uint bits, uint i0, uint c) {
    const uint b = c / 32u, chunk = (c % 32u) / 4u, at = i0 * 4u;
    if (bits == 8u) return words4_at(codes, (b * 8u + chunk) * 64u + at);
    const uint pair = (b / 2u) * 128u * bits;
    if (bits == 3u) {
        const uint u = 8u * (b % 2u) + chunk;
        return (words4_at(codes, pair + (u % 4u) * 64u + at) >> (2u * (u / 4u)) & 0x03030303u) |
               (words4_at(codes, pair + (4u + u % 2u) * 64u + at) >> (u / 2u) & 0x01010101u) << 2;
    }
    const uvec4 lo = words4_at(codes, pair + chunk * 64u + at);
    const uvec4 low = (b % 2u == 0u ? lo : lo >> 4) & 0x0f0f0f0fu;
    if (bits == 4u) return low;
    if (bits == 5u) return low | (words4_at(codes, pair + (8u + chunk / 4u) * 64u + at) >> (b % 2u + 2u * (chunk % 4u)) & 0x01010101u) << 4;
    return low | (words4_at(codes, pair + (8u + chunk / 2u) * 64u + at) >> (2u * (b % 2u) + 4u * (chunk % 2u)) & 0x03030303u) << 4;
}

// The scales and mins (0 without one) of group g of rows r0..r0+3 (r0 % 4 == 0) of a quantized
// matrix of dtype t: a code q stands for scale * q + mn with a min, scale * (q - 2^(bits-1)) without.
// A tile keeps a group's 16 rows' scales side by side, so the 4 rows' are one 64-bit load.
vec4 bytes4(uint w) { return vec4(w & 255u, w >> 8 & 255u, w >> 16 & 255u, w >> 24); }  // a word's 4 bytes
vec4 bytes4_at(uint64_t base, uint i) { return bytes4(Words(base).v[i >> 2]); }  // i % 4 == 0
void group_scales4(const uint t, Matrix m, uint r0, uint g, out vec4 scale, out vec4 mn) {
    const uint G = dtype_group(t), tile = r0 / 16u, lane = r0 % 16u;
    const uint per_tile = (m.cols / G) * 16u, n_tiles = (m.rows + 15u) / 16u;
    mn = vec4(0.0);
    if (dtype_k_scales(t)) {
        const uint all_codes = n_tiles * per_tile, per_tile_super = ((m.cols + 255u) / 256u) * 16u;
        const uint factors = all_codes * (dtype_has_min(t) ? 2u : 1u);  // bytes, a multiple of 64
        const uint at = tile * per_tile + g * 16u + lane, f = tile * per_tile_super + (g / 8u) * 16u + lane;
        scale = halves4_at(m.base, factors / 2u + f) * bytes4_at(m.base, at);
        if (dtype_has_min(t)) mn = halves4_at(m.base, factors / 2u + n_tiles * per_tile_super + f) * bytes4_at(m.base, all_codes + at);
    } else {
        const uint at = tile * per_tile + g * 16u + lane;
        scale = halves4_at(m.base, at);
        if (dtype_has_min(t)) mn = halves4_at(m.base, n_tiles * per_tile + at);
    }
}

// A tile's codes (lane r % 16 of tile r / 16 is row r).
uint64_t tile_codes_base(Matrix m, uint tile) { return m.base + uint64_t(m.scales_bytes) + uint64_t(tile) * uint64_t(m.tile_bytes); }

// Element (r, c) of a matrix of dtype t as f32 (cpu/ops_ref.cpp's ref::weight).
float weight_at(const uint t, Matrix m, uint r, uint c) {
    if (t == F32) return Floats(m.base).v[r * m.cols + c];
    if (t == F16) return f16_at(m.base, r * m.cols + c);
    if (t == BF16) {
        const uint i = r * m.cols + c, w = Words(m.base).v[i >> 1];
        return uintBitsToFloat((i & 1u) != 0u ? w & 0xffff0000u : w << 16);
    }
    const uint bits = dtype_bits(t), i = r % 4u;
    vec4 scale, mn;
    group_scales4(t, m, r - i, c / dtype_group(t), scale, mn);
    const uint code = tile_codes16(tile_codes_base(m, r / 16u), bits, r % 16u - i, c & ~3u)[i] >> (8u * (c % 4u)) & 255u;
    if (dtype_has_min(t)) return scale[i] * float(code) + mn[i];
    return scale[i] * (float(code) - float(1u << (bits - 1u)));
}

// Columns c..c+3 of row r of an F32, F16 or BF16 matrix (m.cols % 4 == 0, c % 4 == 0), as 64-bit loads.
vec4 weights4_at(const uint t, Matrix m, uint r, uint c) {
    const uint i = r * m.cols + c;
    if (t == F32) return floats4_at(m.base, i);
    if (t == F16) return halves4_at(m.base, i);
    const uvec2 w = unpackUint2x32(Pairs(m.base).v[i >> 2]);
    return uintBitsToFloat(uvec4(w.x << 16, w.x & 0xffff0000u, w.y << 16, w.y & 0xffff0000u));
}

// The KV row types of arch/kv_format.h: element i of a row.
const uint KV_F32 = 0u, KV_F16 = 1u, KV_Q8 = 2u;
float kv_at(uint64_t row, uint type, uint i) {
    if (type == KV_F32) return Floats(row).v[i];
    if (type == KV_F16) return f16_at(row, i);
    const uint block = (i / 32u) * 36u;
    const int code = int(byte_at(row, block + 4u + i % 32u) << 24) >> 24;
    return uintBitsToFloat(Words(row).v[block / 4u]) * float(code);
}

// Values i..i+3 (i % 4 == 0) of a KV row whose values are a multiple of 4: f16 as one 64-bit load,
// f32 as two, q8 as a word of codes and its block's scale.
vec4 kv_at4(uint64_t row, uint type, uint i) {
    if (type == KV_F32) return floats4_at(row, i);
    if (type == KV_F16) return halves4_at(row, i);
    const uint block = (i / 32u) * 36u, w = Words(row).v[(block + 4u + i % 32u) >> 2];
    return uintBitsToFloat(Words(row).v[block / 4u]) * vec4(ivec4(w << 24, w << 16, w << 8, w) >> 24);
}

// f32 to f16 bits, rounded to nearest even as the CPU's conversion (packHalf2x16 may truncate).
uint half_bits(float f) {
    const uint x = floatBitsToUint(f), sign = (x >> 16) & 0x8000u, e = (x >> 23) & 255u;
    uint m = x & 0x7fffffu;
    if (e == 255u) return sign | 0x7c00u | (m != 0u ? 0x200u : 0u);
    const int E = int(e) - 112;  // the f16 exponent
    if (E >= 31) return sign | 0x7c00u;
    uint shift = 13u, h;
    if (E <= 0) {  // subnormal: the 24-bit significand shifted down
        if (E < -10) return sign;
        m |= 0x800000u;
        shift = uint(14 - E);
        h = m >> shift;
    } else {
        h = uint(E) << 10 | m >> 13;
    }
    const uint rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (h & 1u) != 0u)) h++;  // a carry rounds up the exponent
    return sign | h;
}

uint kv_row_bytes(uint type, uint n) { return type == KV_F32 ? n * 4u : type == KV_F16 ? n * 2u : (n + 31u) / 32u * 36u; }

// cap * tanh(x / cap), without the inf / inf some tanh implementations give for large arguments.
float soft_cap(float x, float cap) { return cap * tanh(clamp(x / cap, -15.0, 15.0)); }
