// The table of weight types, and their packers and dequantizers (the same code on every CPU).
#include "weight_types.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "planes.h"

namespace nanoserve {

#define NS_LAYOUT 1
#include "quant_q.h"
#include "quant_k.h"
#include "quant_mx.h"
#undef NS_LAYOUT

namespace {

using PackFn = void (*)(const uint8_t* block, uint8_t* dst, int f);
using DequantFn = void (*)(const uint8_t* block, float* out);

struct Entry {
  WeightType type;
  PackFn pack;
  DequantFn dequantize;
};

template <int64_t T>
constexpr Entry q_entry(const char* name, int64_t file_bytes) {
  return {{name, T, 32, file_bytes, QLayout<T>::kBytes, true}, q_pack<T>, q_dequantize<T>};
}

template <int64_t T>
constexpr Entry k_entry(const char* name, int64_t file_bytes) {
  return {{name, T, 256, file_bytes, KLayout<T>::kBytes, true}, k_pack<T>, k_dequantize<T>};
}

void f32_row(const uint8_t* b, float* out) { std::memcpy(out, b, 4); }
void f16_row(const uint8_t* b, float* out) { *out = planes::half_to_float(planes::u16_at(b)); }
void bf16_row(const uint8_t* b, float* out) { *out = planes::bf16_to_float(planes::u16_at(b)); }

// Float types have no packed form: they are read by dequantizing (embeddings), and a linear
// stored so is re-quantized by the loader, which says so.
const Entry kEntries[] = {
    {{"f32", kF32, 1, 4, 0, false}, nullptr, f32_row},
    {{"f16", kF16, 1, 2, 0, false}, nullptr, f16_row},
    {{"bf16", kBF16, 1, 2, 0, false}, nullptr, bf16_row},
    q_entry<kQ4_0>("q4_0", 18),
    q_entry<kQ4_1>("q4_1", 20),
    q_entry<kQ5_0>("q5_0", 22),
    q_entry<kQ5_1>("q5_1", 24),
    q_entry<kQ8_0>("q8_0", 34),
    k_entry<kQ2_K>("q2_k", 84),
    k_entry<kQ3_K>("q3_k", 110),
    k_entry<kQ4_K>("q4_k", 144),
    k_entry<kQ5_K>("q5_k", 176),
    k_entry<kQ6_K>("q6_k", 210),
    {{"mxfp4", kMXFP4, 32, 17, MxLayout::kBytes, true}, mx_pack, mx_dequantize},
};

const Entry* find_entry(int64_t ggml) {
  for (const Entry& e : kEntries)
    if (e.type.ggml == ggml) return &e;
  return nullptr;
}

}  // namespace

const WeightType* find_weight_type(int64_t ggml) {
  const Entry* e = find_entry(ggml);
  return e ? &e->type : nullptr;
}

void pack_features(const WeightType& t, const uint8_t* src, int64_t stride, const int64_t* order,
                   int64_t n, int64_t k, uint8_t* dst, int64_t f0, int64_t f1) {
  const Entry* e = find_entry(t.ggml);
  const int64_t supers = k / t.inputs;
  for (int64_t f = f0; f < f1 && f < n; ++f) {
    const uint8_t* row = src + (order ? order[f] : f) * stride;
    uint8_t* block = dst + (f / kFeatureBlock) * supers * t.packed_bytes;
    for (int64_t s = 0; s < supers; ++s)
      e->pack(row + s * t.file_bytes, block + s * t.packed_bytes, static_cast<int>(f % kFeatureBlock));
  }
}

void dequantize_row(const WeightType& t, const uint8_t* src, int64_t k, float* out) {
  const Entry* e = find_entry(t.ggml);
  for (int64_t i = 0; i < k; i += t.inputs) e->dequantize(src + i / t.inputs * t.file_bytes, out + i);
}

}  // namespace nanoserve
