// Writing one feature's levels and scales into the packed planes of weight_types.h, and reading
// the fields of a GGUF block: the packers' shared vocabulary. Plain C++, run once at load.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace nanoserve::planes {

// One feature (f, 0..15, its lane in the block) of one group of 32 inputs: `level[i]` is input
// i's level, unsigned, as the kernel's dot product reads it. Each byte of the feature's lanes
// is written whole (no read-modify-write), so packing streams.
inline void put_l4(uint8_t* dst, int f, const uint8_t* level) {
  for (int c = 0; c < 4; ++c)
    for (int b = 0; b < 4; ++b)
      dst[64 * c + 4 * f + b] = static_cast<uint8_t>((level[8 * c + b] & 15) | ((level[8 * c + 4 + b] & 15) << 4));
}

// Bit `bit` of each level into H1.
inline void put_h1(uint8_t* dst, int f, const uint8_t* level, int bit) {
  for (int b = 0; b < 4; ++b) {
    int v = 0;
    for (int c = 0; c < 4; ++c)
      v |= (((level[8 * c + b] >> bit) & 1) << c) | (((level[8 * c + 4 + b] >> bit) & 1) << (4 + c));
    dst[4 * f + b] = static_cast<uint8_t>(v);
  }
}

// Bits `shift` and `shift + 1` of each level into L2.
inline void put_l2(uint8_t* dst, int f, const uint8_t* level, int shift) {
  for (int half = 0; half < 2; ++half) {
    for (int b = 0; b < 4; ++b) {
      int v = 0;
      for (int c = 0; c < 4; ++c) v |= ((level[8 * c + 4 * half + b] >> shift) & 3) << (2 * c);
      dst[64 * half + 4 * f + b] = static_cast<uint8_t>(v);
    }
  }
}

// Whole bytes (u = w + 128) into L8.
inline void put_l8(uint8_t* dst, int f, const uint8_t* u) {
  for (int j = 0; j < 8; ++j)
    for (int b = 0; b < 4; ++b) dst[64 * j + 4 * f + b] = u[4 * j + b];
}

inline void put_u16(uint8_t* dst, int f, uint16_t bits) { std::memcpy(dst + 2 * f, &bits, 2); }
inline void put_u8(uint8_t* dst, int f, uint8_t v) { dst[f] = v; }

inline uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// IEEE half -> float, exactly.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else {
    const float value = std::ldexp(static_cast<float>(man), -24);  // subnormal: exact
    return sign ? -value : value;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace nanoserve::planes
