// common.glsl — what every shader shares: buffers reached by device address (the addresses the
// Vulkan backend's Memory hands out are Vulkan buffer device addresses, so the host's pointer
// arithmetic in them is the shaders' too), read as 32-bit words so that no 8- or 16-bit storage
// feature is needed, and the element readers of weights and KV rows.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Floats { float v[]; };

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

// The stored code of lane i (< 16), column c of a tile's codes (cpu/tile_layout.h's tile_code).
uint tile_code(uint64_t codes, uint bits, uint i, uint c) {
    const uint b = c / 32u, chunk = (c % 32u) / 4u, at = i * 4u + c % 4u;
    if (bits == 8u) return byte_at(codes, (b * 8u + chunk) * 64u + at);
    const uint pair = (b / 2u) * 128u * bits;
    if (bits == 3u) {
        const uint u = 8u * (b % 2u) + chunk;
        return (byte_at(codes, pair + (u % 4u) * 64u + at) >> (2u * (u / 4u)) & 3u) |
               (byte_at(codes, pair + (4u + u % 2u) * 64u + at) >> (u / 2u) & 1u) << 2;
    }
    const uint lo = byte_at(codes, pair + chunk * 64u + at);
    const uint low = b % 2u == 0u ? (lo & 15u) : (lo >> 4);
    if (bits == 4u) return low;
    if (bits == 5u) return low | ((byte_at(codes, pair + (8u + chunk / 4u) * 64u + at) >> (b % 2u + 2u * (chunk % 4u))) & 1u) << 4;
    return low | ((byte_at(codes, pair + (8u + chunk / 2u) * 64u + at) >> (2u * (b % 2u) + 4u * (chunk % 2u))) & 3u) << 4;
}

// Element (r, c) of a matrix of dtype t as f32 (cpu/ops_ref.cpp's ref::weight).
float weight_at(const uint t, Matrix m, uint r, uint c) {
    if (t == F32) return Floats(m.base).v[r * m.cols + c];
    if (t == F16) return f16_at(m.base, r * m.cols + c);
    if (t == BF16) {
        const uint i = r * m.cols + c, w = Words(m.base).v[i >> 1];
        return uintBitsToFloat((i & 1u) != 0u ? w & 0xffff0000u : w << 16);
    }
    const uint bits = dtype_bits(t), G = dtype_group(t), tile = r / 16u, lane = r % 16u, g = c / G;
    const uint per_tile = (m.cols / G) * 16u, n_tiles = (m.rows + 15u) / 16u;
    float scale, mn = 0.0;
    if (dtype_k_scales(t)) {
        const uint all_codes = n_tiles * per_tile, per_tile_super = ((m.cols + 255u) / 256u) * 16u;
        const uint factors = all_codes * (dtype_has_min(t) ? 2u : 1u);  // bytes, even
        const uint at = tile * per_tile + g * 16u + lane, f = tile * per_tile_super + (g / 8u) * 16u + lane;
        scale = f16_at(m.base, factors / 2u + f) * float(byte_at(m.base, at));
        if (dtype_has_min(t)) mn = f16_at(m.base, factors / 2u + n_tiles * per_tile_super + f) * float(byte_at(m.base, all_codes + at));
    } else {
        const uint at = tile * per_tile + g * 16u + lane;
        scale = f16_at(m.base, at);
        if (dtype_has_min(t)) mn = f16_at(m.base, n_tiles * per_tile + at);
    }
    const float code = float(tile_code(m.base + uint64_t(m.scales_bytes) + uint64_t(tile) * uint64_t(m.tile_bytes), bits, lane, c));
    if (dtype_has_min(t)) return scale * code + mn;
    return scale * (code - float(1u << (bits - 1u)));
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
