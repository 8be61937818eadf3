// The 32-input family: q4_0, q4_1, q5_0, q5_1, q8_0.
//
// One GGUF block is one group of 32 inputs with an fp16 scale d (and a minimum m for the _1
// types). The kernels read unsigned levels q, and w = d * q + m:
//   q4_0  levels 0..15, m = -8 d      (the file's d * (q - 8))     packed L4, d
//   q4_1  levels 0..15, m stored                                   packed L4, d, m
//   q5_0  levels 0..31, m = -16 d     (the file's d * (q - 16))    packed L4, H1 (bit 4), d
//   q5_1  levels 0..31, m stored                                   packed L4, H1, d, m
//   q8_0  levels -127..127 stored as q + 128, no m                 packed L8, d
// m = -8 d and -16 d are exact in float (powers of two), so they are computed, not stored.
//
// NS_LAYOUT: the GGUF side (decode a block, pack it, dequantize it), compiled once.
// NS_DOTS: the dot kernels, compiled per ISA over simd.h (see kernels.h).

// Packed bytes of one group of 16 features: the planes, then the fp16 d (and m).
template <int64_t Type>
struct QLayout {
  static constexpr bool kFive = Type == kQ5_0 || Type == kQ5_1;
  static constexpr bool kMin = Type == kQ4_1 || Type == kQ5_1;  // m stored, not -8 d / -16 d
  static constexpr int64_t kBytes = Type == kQ8_0 ? 512 + 32 : 256 + (kFive ? 64 : 0) + (kMin ? 64 : 32);
};

#if defined(NS_LAYOUT)

struct QDecoded {
  uint8_t level[32];  // unsigned, as packed
  uint16_t d, m;      // fp16 bits; m only for q4_1 / q5_1
};

template <int64_t Type>
inline void q_decode(const uint8_t* b, QDecoded& out) {
  using planes::u16_at;
  out.d = u16_at(b);
  out.m = 0;
  if constexpr (Type == kQ4_0 || Type == kQ4_1) {
    const uint8_t* qs = b + (Type == kQ4_0 ? 2 : 4);
    if constexpr (Type == kQ4_1) out.m = u16_at(b + 2);
    for (int j = 0; j < 16; ++j) out.level[j] = qs[j] & 15, out.level[j + 16] = qs[j] >> 4;
  } else if constexpr (Type == kQ5_0 || Type == kQ5_1) {
    const int at = Type == kQ5_0 ? 2 : 4;
    if constexpr (Type == kQ5_1) out.m = u16_at(b + 2);
    const uint32_t qh = planes::u32_at(b + at);
    const uint8_t* qs = b + at + 4;
    for (int j = 0; j < 16; ++j) {
      out.level[j] = static_cast<uint8_t>((qs[j] & 15) | (((qh >> j) & 1) << 4));
      out.level[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
  } else {  // q8_0
    for (int j = 0; j < 32; ++j) out.level[j] = static_cast<uint8_t>(static_cast<int8_t>(b[2 + j]) + 128);
  }
}

template <int64_t Type>
inline void q_dequantize(const uint8_t* b, float* out) {
  QDecoded q;
  q_decode<Type>(b, q);
  const float d = planes::half_to_float(q.d);
  for (int i = 0; i < 32; ++i) {
    if constexpr (Type == kQ4_0) out[i] = d * static_cast<float>(q.level[i] - 8);
    else if constexpr (Type == kQ5_0) out[i] = d * static_cast<float>(q.level[i] - 16);
    else if constexpr (Type == kQ8_0) out[i] = d * static_cast<float>(q.level[i] - 128);
    else out[i] = d * static_cast<float>(q.level[i]) + planes::half_to_float(q.m);
  }
}

template <int64_t Type>
inline void q_pack(const uint8_t* b, uint8_t* dst, int f) {
  QDecoded q;
  q_decode<Type>(b, q);
  if constexpr (Type == kQ8_0) {
    planes::put_l8(dst, f, q.level);
    planes::put_u16(dst + 512, f, q.d);
    return;
  }
  planes::put_l4(dst, f, q.level);
  uint8_t* rest = dst + 256;
  if constexpr (Type == kQ5_0 || Type == kQ5_1) {
    planes::put_h1(rest, f, q.level, 4);
    rest += 64;
  }
  planes::put_u16(rest, f, q.d);
  if constexpr (Type == kQ4_1 || Type == kQ5_1) planes::put_u16(rest + 32, f, q.m);
}

#endif  // NS_LAYOUT

#if defined(NS_DOTS)

// R rows' dot products with one chunk c (inputs 8c..8c+7) of levels: low and high 4 inputs.
template <int R>
inline void chunk_dots(Dots* dots, B64 wlo, B64 whi, const int8_t* const* xq, int64_t at) {
  for (int r = 0; r < R; ++r) dots[r] = d_add(dots[r], wlo, whi, load_x4(xq[r] + at), load_x4(xq[r] + at + 4));
}

// One group's dot products of the 4- and 5-bit types (L4, and H1 for bit 4), per row, from
// `start` (a type's offset term, or 0): the 4 chunks summed narrow at once (4-bit levels), or 2
// by 2 (5-bit). With a `Table`, each 4-bit code is read through it (b_lookup) as a level of up
// to 24 (mxfp4, quant_mx.h), and the chunks are summed 2 by 2 as well.
template <int R, bool Five, const uint8_t* Table = nullptr>
inline void q45_group_dots(const uint8_t* w, const int8_t* const* xq, int64_t at, const int32_t* start, I16* dot) {
  const B64 h1 = Five ? b_load(w + 256) : B64{};
  constexpr int kRun = Five || Table != nullptr ? 2 : 4;  // chunks per narrow sum
  // Unrolled: the shifts of b_field then take constants, and the rows' accumulators stay in
  // registers across chunks (without it GCC kept AVX2's on the stack).
#pragma GCC unroll 2
  for (int c0 = 0; c0 < 4; c0 += kRun) {
    Narrow sums[R];
    for (int r = 0; r < R; ++r) sums[r] = c0 == 0 ? n_start(start[r]) : n_start(dot[r]);
#pragma GCC unroll 4
    for (int c = c0; c < c0 + kRun; ++c) {
      const B64 packed = b_load(w + 64 * c);
      B64 wlo = b_low_nibbles(packed), whi = b_high_nibbles(packed);  // inputs 8c.., 8c+4..
      if constexpr (Five) {
        wlo = b_or(wlo, b_field(h1, c, 1, 4));
        whi = b_or(whi, b_field(h1, c + 4, 1, 4));
      }
      if constexpr (Table != nullptr) wlo = b_lookup(wlo, Table), whi = b_lookup(whi, Table);
      for (int r = 0; r < R; ++r)
        sums[r] = n_add(sums[r], wlo, whi, load_x4(xq[r] + at + 8 * c), load_x4(xq[r] + at + 8 * c + 4));
    }
    for (int r = 0; r < R; ++r) dot[r] = c0 == 0 ? n_end(sums[r], start[r]) : n_end(sums[r], dot[r]);
  }
}

// acc += dot * (d_w * d_x) + m_w * s_x, per row: a group's one fixed order of rounding.
template <int R>
inline void accumulate(F16* acc, const I16* dot, F16 dw, const F16* mw, const QuantizedRows& x,
                       int64_t r0, int64_t group) {
  for (int r = 0; r < R; ++r) {
    const int64_t at = (r0 + r) * x.groups + group;
    acc[r] = f_fma(i_to_f(dot[r]), f_mul(dw, f_set1(x.d[at])), acc[r]);
    if (mw) acc[r] = f_fma(*mw, f_set1(x.s[at]), acc[r]);
  }
}

template <int64_t Type>
struct QFormat {
  static constexpr int64_t kInputs = 32;
  static constexpr bool kFive = QLayout<Type>::kFive;
  static constexpr int64_t kBytes = QLayout<Type>::kBytes;

  template <int R>
  static void block(const uint8_t* w, const QuantizedRows& x, int64_t r0, int64_t g,
                    const int8_t* const* xq, F16* acc) {
    I16 dot[R];
    const int64_t at = g * kGroup;
    if constexpr (Type == kQ8_0) {
      // The weights are stored as w + 128: where the ISA's dot product sums u * x rather than
      // w * x, it starts from -128 * sum(x), so the sum comes out exact.
      for (int r = 0; r < R; ++r)
        dot[r] = kQ8DotHasOffset ? i_set1(-128 * x.qsum[(r0 + r) * x.groups + g]) : i_zero();
      for (int j = 0; j < 8; ++j) {
        const B64 levels = b_load(w + 64 * j);
        for (int r = 0; r < R; ++r) dot[r] = i_dot_q8(dot[r], levels, load_x4(xq[r] + at + 4 * j));
      }
      accumulate<R>(acc, dot, f_load_f16(reinterpret_cast<const uint16_t*>(w + 512)), nullptr, x, r0, g);
    } else if constexpr (Type == kQ4_0 || Type == kQ5_0) {
      // w = d (q - offset): the group's integer dot product starts from -offset * sum(x)
      // (exact: |dot| < 2^17; one broadcast where a zero was), so a row costs one float
      // multiply-add here, not two.
      constexpr int32_t offset = kFive ? 16 : 8;
      int32_t start[R];
      for (int r = 0; r < R; ++r) start[r] = -offset * x.qsum[(r0 + r) * x.groups + g];
      q45_group_dots<R, kFive>(w, xq, at, start, dot);
      const F16 dw = f_load_f16(reinterpret_cast<const uint16_t*>(w + 256 + (kFive ? 64 : 0)));
      accumulate<R>(acc, dot, dw, nullptr, x, r0, g);
    } else {  // q4_1, q5_1: the stored minimum m, a float, times the inputs' sum
      constexpr int32_t zeros[R] = {};
      q45_group_dots<R, kFive>(w, xq, at, zeros, dot);
      const uint8_t* scales = w + 256 + (kFive ? 64 : 0);
      const F16 dw = f_load_f16(reinterpret_cast<const uint16_t*>(scales));
      const F16 mw = f_load_f16(reinterpret_cast<const uint16_t*>(scales + 32));
      accumulate<R>(acc, dot, dw, &mw, x, r0, g);
    }
  }
};

#endif  // NS_DOTS
