// The microscaling family: mxfp4 (gpt-oss's experts).
//
// One GGUF block is 32 inputs under one shared power-of-two scale, a byte e (E8M0), then 16
// bytes of 4-bit codes (input j in byte j's low nibble, input j + 16 in its high one, as q4_0).
// A code is an E2M1 number; ggml doubles them to integers and halves the scale:
//   code  0..7:  0, 1, 2, 3, 4, 6, 8, 12      code 8..15: the same, negated
//   w = value * 2^(e - 128)                  (GGML_E8M0_TO_FP32_HALF: e < 2 are subnormal)
// The kernels read a code through a 16-byte table as u = value + 12 (0..24, unsigned), and a
// group's integer dot product starts from -12 * sum(x), as q4_0's starts from -8 * sum(x).
//   packed: L4 (the codes), then the scale per feature as bfloat16 bits, 16 in a row. Every
//   2^(e - 128), the two subnormals included, is a float whose low 16 bits are zero, so the
//   bfloat16 holds it exactly (two bytes a feature where the file has one: 288 bytes per 16
//   features against the file's 272).
//
// NS_LAYOUT: the GGUF side (pack, dequantize), compiled once.
// NS_DOTS: the dot kernel, compiled per ISA over simd.h (see kernels.h).

struct MxLayout {
  static constexpr int64_t kBytes = 256 + 32;
  static constexpr int32_t kOffset = 12;  // u = value + 12
};

#if defined(NS_LAYOUT)

constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128) as float bits, as ggml computes it.
inline uint32_t e8m0_half_bits(uint8_t e) { return e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23; }

inline void mx_dequantize(const uint8_t* b, float* out) {
  const uint32_t bits = e8m0_half_bits(b[0]);
  float d;
  std::memcpy(&d, &bits, 4);
  for (int j = 0; j < 16; ++j) {
    out[j] = d * static_cast<float>(kMxfp4Values[b[1 + j] & 15]);
    out[j + 16] = d * static_cast<float>(kMxfp4Values[b[1 + j] >> 4]);
  }
}

inline void mx_pack(const uint8_t* b, uint8_t* dst, int f) {
  uint8_t code[32];
  for (int j = 0; j < 16; ++j) code[j] = b[1 + j] & 15, code[j + 16] = b[1 + j] >> 4;
  planes::put_l4(dst, f, code);
  planes::put_u16(dst + 256, f, static_cast<uint16_t>(e8m0_half_bits(b[0]) >> 16));
}

#endif  // NS_LAYOUT

#if defined(NS_DOTS)

struct MxFormat {
  static constexpr int64_t kInputs = 32;
  static constexpr int64_t kBytes = MxLayout::kBytes;
  // The codes' values plus 12, in code order: what b_lookup turns a code into.
  static constexpr uint8_t kLevels[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

  template <int R>
  static void block(const uint8_t* w, const QuantizedRows& x, int64_t r0, int64_t g,
                    const int8_t* const* xq, F16* acc) {
    // Levels up to 24: a maddubs pair is at most 6,096 and a chunk 12,192, so AVX2's int16
    // sums take 2 chunks at a time (24,384), as the 5-bit types' do.
    I16 dot[R];
    int32_t start[R];
    for (int r = 0; r < R; ++r) start[r] = -MxLayout::kOffset * x.qsum[(r0 + r) * x.groups + g];
    q45_group_dots<R, false, kLevels>(w, xq, g * kGroup, start, dot);
    accumulate<R>(acc, dot, f_load_bf16(reinterpret_cast<const uint16_t*>(w + 256)), nullptr, x, r0, g);
  }
};

#endif  // NS_DOTS
