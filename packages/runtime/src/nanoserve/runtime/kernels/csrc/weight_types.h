// The weight types the linears read, in one table: each GGML block format as the file stores it
// (inputs per block, bytes per block) and as nanoserve's kernels read it (bytes per packed block
// of 16 output features), with its packer, its dequantizer and, per ISA, its dot kernel.
//
// Types are named by GGML's own type numbers, so a GGUF tensor's type picks its row here.
//
// A packed weight is, per block of 16 output features, its superblocks in input order (one
// GGUF block of `inputs` inputs each), so a thread's features are one contiguous stream. Inside
// a superblock every plane is feature-interleaved, four inputs per feature at a time, as the
// ISA's dot product reads them (one 32-bit lane per feature). The planes, per group of 32 inputs:
//   L4: 4 chunks of 64 bytes; byte 4f+b of chunk c: input 8c+b of feature f in the low nibble,
//       input 8c+4+b in the high nibble (the level's low 4 bits);
//   H1: 64 bytes; byte 4f+b, bit c: one more bit of input 8c+b, bit 4+c: of input 8c+4+b;
//   L2: 2 x 64 bytes; byte 4f+b of the first, bits 2c..2c+1: 2 bits of input 8c+b; of the
//       second: of input 8c+4+b;
//   L8: 8 chunks of 64 bytes; byte 4f+b of chunk j: input 4j+b as w + 128.
// Scales are per feature, 16 in a row: fp16 (d, dmin, m), bf16 (mxfp4's powers of two), or one
// byte per feature.
#pragma once

#include <cstdint>

namespace nanoserve {

// GGML's type numbers (ggml.h, gguf.GGMLQuantizationType).
enum GgmlType : int64_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23,
  kBF16 = 30, kMXFP4 = 39,
};
constexpr int64_t kMaxGgmlType = 40;

constexpr int64_t kGroup = 32;         // inputs per quantization group of the activations
constexpr int64_t kFeatureBlock = 16;  // output features per packed block (one vector of lanes)
constexpr int64_t kSuperInputs = 256;  // inputs per K-quant block

struct WeightType {
  const char* name;     // "q4_k": as the boot line and /health name it
  int64_t ggml;         // GGML's number
  int64_t inputs;       // inputs per block (32 or 256)
  int64_t file_bytes;   // bytes of one block in the file, per feature
  int64_t packed_bytes; // bytes of one block packed, per 16 features
  bool linear;          // a dot kernel reads it (else: dequantize only, e.g. f16 embeddings)
};

// The rows of the table, one per type nanoserve reads (see weight_types.cpp for the entries).
const WeightType* find_weight_type(int64_t ggml);

// Packing and dequantizing are the same code on every CPU (they run once, at load, or on a
// handful of embedding rows); compiled in the portable file only.
//   pack: rows [n, row bytes] of GGUF blocks (row f of the weight is src + order[f] * stride, or
//   f * stride without an order) into [ceil(n / 16), k / inputs, packed_bytes]; features [f0, f1)
//   of n, f0 a multiple of 16 (padding features past n are zero).
void pack_features(const WeightType& t, const uint8_t* src, int64_t stride, const int64_t* order,
                   int64_t n, int64_t k, uint8_t* dst, int64_t f0, int64_t f1);
//   dequantize: one row of k values, exactly the file's (each a float32 of the decoded block).
void dequantize_row(const WeightType& t, const uint8_t* src, int64_t k, float* out);

}  // namespace nanoserve
