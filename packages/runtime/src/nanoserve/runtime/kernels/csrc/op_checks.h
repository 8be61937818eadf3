// What the op files share: the ISA's kernel table as loaded, how work is split between torch's
// threads, and the argument checks (each failure names the argument and what it got).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "kernel_table.h"

namespace nanoserve {

// The kernel table this process runs (the best the CPU has, or the one a test forced).
const KernelTable* active_table();

// Work below this many multiply-adds runs on the calling thread: waking the pool costs more.
inline constexpr int64_t kParallelWork = 1 << 16;

inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kParallelWork / std::max<int64_t>(1, work_per_item));
}

inline void check_rows(const at::Tensor& x, const char* name, int64_t multiple) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              name, " must be a 2-D float32 CPU tensor, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(x.size(1) % multiple == 0, name, " width ", x.size(1), " is not a multiple of ",
              multiple);
}

inline void check_index(const at::Tensor& t, const char* name, int64_t length) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous() &&
                  t.size(0) == length,
              name, " must be a contiguous int64 vector of ", length, ", got ", t.sizes(), " ",
              t.scalar_type());
}

// The weights' ops (weight_ops.cpp).
at::Tensor linear(const at::Tensor& x, at::TensorList weights, at::IntArrayRef types,
                  at::IntArrayRef features, const std::optional<at::Tensor>& bias);
at::Tensor pack_weight(const at::Tensor& rows, int64_t ggml, int64_t k,
                       const std::optional<at::Tensor>& order);
at::Tensor dequantize_rows(const at::Tensor& rows, int64_t ggml, int64_t k,
                           const std::optional<at::Tensor>& ids);
std::tuple<std::string, int64_t, int64_t, int64_t, bool> weight_type_info(int64_t ggml);

// The recurrent layers' ops (recurrent_ops.cpp).
at::Tensor delta_net_step(at::Tensor state, const at::Tensor& slots, const at::Tensor& positions,
                          const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& decay, const at::Tensor& beta);
at::Tensor conv_step(at::Tensor state, const at::Tensor& slots, const at::Tensor& positions,
                     const at::Tensor& x, const at::Tensor& kernel,
                     const std::optional<at::Tensor>& bias);
at::Tensor ssm_step(at::Tensor state, const at::Tensor& slots, const at::Tensor& positions,
                    const at::Tensor& u, const at::Tensor& b, const at::Tensor& c,
                    const at::Tensor& decay);

// The memory's read speed (memory_ops.cpp).
int64_t read_bytes(const at::Tensor& bytes);

}  // namespace nanoserve
