// The memory's read speed as the kernels see it: one pass over a buffer on torch's threads,
// split evenly between them as the linears split a weight. benchmarks/roofline.py times it to
// price a decode step's bytes; nothing in serving calls it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>

#include "op_checks.h"

namespace nanoserve {

// The 64-bit sum of every whole 64-byte line of `bytes` (uint8, contiguous): a value the
// compiler cannot skip computing, so every line is read once.
int64_t read_bytes(const at::Tensor& bytes) {
  TORCH_CHECK(bytes.device().is_cpu() && bytes.scalar_type() == at::kByte && bytes.is_contiguous(),
              "bytes must be a contiguous uint8 CPU tensor, got ", bytes.scalar_type());
  constexpr int64_t kLine = 8;  // 64-bit words per 64-byte line
  const auto* words = reinterpret_cast<const uint64_t*>(bytes.data_ptr<uint8_t>());
  const int64_t lines = bytes.numel() / (8 * kLine);
  std::atomic<uint64_t> total{0};
  at::parallel_for(0, lines, 1 << 12, [&](int64_t l0, int64_t l1) {
    uint64_t lanes[kLine] = {0, 0, 0, 0, 0, 0, 0, 0};  // independent sums: no chain per load
    for (int64_t line = l0; line < l1; ++line) {
      for (int64_t j = 0; j < kLine; ++j) lanes[j] += words[line * kLine + j];
    }
    uint64_t sum = 0;
    for (uint64_t lane : lanes) sum += lane;
    total.fetch_add(sum, std::memory_order_relaxed);
  });
  return static_cast<int64_t>(total.load());
}

}  // namespace nanoserve
