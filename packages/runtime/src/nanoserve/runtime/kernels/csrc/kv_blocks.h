// A K/V pool row (one slot's K or V of one head) in each stored form: float values, or GGUF
// blocks of 32 values as llama.cpp's quantized caches keep them (`-ctk/-ctv q8_0|q4_0`).
//
//   q8_0  34 bytes: d (fp16), then 32 int8 q; value = q * d
//   q4_0  18 bytes: d (fp16), then 16 bytes of nibbles, value j in the low nibble of byte j and
//         value j + 16 in its high one; value = (q - 8) * d
//
// A row is written by rounding as ggml's reference quantizers do (quantize_row_q8_0_ref,
// quantize_row_q4_0_ref; the `gguf` package's quantize_blocks give the same bytes), one value
// at a time in float: the bytes do not depend on the ISA. It is read 16 values at a time
// (half a block), each value q * d rounded once in float, as the `gguf` package dequantizes.
//
// A row of blocks is kept turned through a Hadamard matrix first, as llama.cpp keeps its
// quantized caches (kv_rotation_width: K by the largest power of two dividing head_dim, V by 64,
// each chunk of that width on its own): an outlier in one value is spread over the chunk, so a
// block's scale no longer follows it. The turn is orthonormal and its own inverse, so attention
// turns each query through K's matrix (q . k unchanged) and each output back through V's.
//
// Included in kernels.h, inside an ISA's namespace, after simd.h.

constexpr int64_t kQ8_0Bytes = kv_block_bytes(KvType::kQ8_0), kQ4_0Bytes = kv_block_bytes(KvType::kQ4_0);

inline uint16_t u16_of(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Values 16c .. 16c + 15 of a row stored as KV.
template <KvType KV>
inline F16 load_kv(const uint8_t* row, int64_t c) {
  if constexpr (KV == KvType::kBF16) {
    return f_load_bf16(reinterpret_cast<const uint16_t*>(row) + 16 * c);
  } else if constexpr (KV == KvType::kF16) {
    return f_load_f16(reinterpret_cast<const uint16_t*>(row) + 16 * c);
  } else if constexpr (KV == KvType::kF32) {
    return f_load(reinterpret_cast<const float*>(row) + 16 * c);
  } else if constexpr (KV == KvType::kQ8_0) {
    const uint8_t* block = row + c / 2 * kQ8_0Bytes;
    return f_mul(i_to_f(i_from_i8(block + 2 + 16 * (c % 2))), f_set1(h_to_f(u16_of(block))));
  } else {  // q4_0: half 0 is the low nibbles of the block's 16 bytes, half 1 the high ones
    const uint8_t* block = row + c / 2 * kQ4_0Bytes;
    const I16 bytes = i_from_u8(block + 2);
    const I16 q = c % 2 ? i_shr(bytes, 4) : i_and(bytes, i_set1(15));
    return f_mul(i_to_f(i_sub(q, i_set1(8))), f_set1(h_to_f(u16_of(block))));
  }
}

inline void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// x <- H x over each `width`-value chunk of `dim`: H is Sylvester's Hadamard matrix in natural
// order (H[i][j] = (-1)^popcount(i & j)) scaled by 1 / sqrt(width), as the butterflies of a fast
// Walsh-Hadamard transform, then the scale: each value the same adds on every ISA.
inline void hadamard(float* x, int64_t dim, int64_t width) {
  const float scale = 1.f / std::sqrt(static_cast<float>(width));
  for (float* y = x; y < x + dim; y += width) {
    for (int64_t s = 1; s < width; s *= 2)
      for (int64_t i = 0; i < width; i += 2 * s)
        for (int64_t j = i; j < i + s; ++j) {
          const float a = y[j], b = y[j + s];
          y[j] = a + b;
          y[j + s] = a - b;
        }
    for (int64_t j = 0; j < width; ++j) y[j] *= scale;
  }
}

// quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d) (x times 1 / d, half away from zero).
inline void store_q8_0(uint8_t* block, const float* x) {
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
  put_u16(block, f_to_h(d));
  for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
}

// quantize_row_q4_0_ref: d = -max / 8 for the value of largest magnitude (the first such),
// q = min(15, trunc(x / d + 8.5)).
inline void store_q4_0(uint8_t* block, const float* x) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
  }
  const float d = max / -8.f, id = d != 0.f ? 1.f / d : 0.f;
  put_u16(block, f_to_h(d));
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[16 + j] * id + 8.5f)));
    block[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// One head's `dim` values into a row stored as `kv` (a row of blocks turned first: `width`,
// kv_rotation_width's, and `turned`, room for dim floats).
inline void store_kv(uint8_t* row, const float* src, int64_t dim, KvType kv, int64_t width, float* turned) {
  if (width > 0) {
    std::memcpy(turned, src, dim * sizeof(float));
    hadamard(turned, dim, width);
    src = turned;
  }
  if (kv == KvType::kQ8_0) {
    for (int64_t b = 0; b < dim / 32; ++b) store_q8_0(row + b * kQ8_0Bytes, src + 32 * b);
    return;
  }
  if (kv == KvType::kQ4_0) {
    for (int64_t b = 0; b < dim / 32; ++b) store_q4_0(row + b * kQ4_0Bytes, src + 32 * b);
    return;
  }
  for (int64_t c = 0; c < dim; c += 16) {
    if (kv == KvType::kBF16) f_store_bf16(reinterpret_cast<uint16_t*>(row) + c, f_load(src + c));
    else if (kv == KvType::kF16) f_store_f16(reinterpret_cast<uint16_t*>(row) + c, f_load(src + c));
    else f_store(reinterpret_cast<float*>(row) + c, f_load(src + c));
  }
}
