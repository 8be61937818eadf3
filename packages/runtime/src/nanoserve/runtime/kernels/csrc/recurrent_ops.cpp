// The recurrent layers' decode steps as torch operators: argument checks, the output, and the
// split of (row, head) tasks between torch's threads; the bodies are recurrent.h's, per ISA.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "op_checks.h"

namespace nanoserve {
namespace {

void check_float(const at::Tensor& x, const char* name, at::IntArrayRef shape) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.sizes() == shape,
              name, " must be a contiguous float32 CPU tensor of ", shape, ", got ", x.sizes(),
              " ", x.scalar_type());
}

}  // namespace

// One token of gated DeltaNet per row, each row's state updated in place in `state`.
at::Tensor delta_net_step(at::Tensor state, const at::Tensor& slots, const at::Tensor& positions,
                          const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& decay, const at::Tensor& beta) {
  TORCH_CHECK(state.dim() == 4, "the state must be [slots + 1, heads, k_dim, v_dim], got ",
              state.sizes());
  const int64_t heads = state.size(1), kd = state.size(2), vd = state.size(3);
  const int64_t rows = slots.size(0);
  check_float(state, "state", state.sizes());
  TORCH_CHECK(vd % 16 == 0, "v_dim ", vd, " is not a multiple of 16");
  check_index(slots, "slots", rows);
  check_index(positions, "positions", rows);
  check_float(q, "q", {rows, heads, kd});
  check_float(k, "k", {rows, heads, kd});
  check_float(v, "v", {rows, heads, vd});
  check_float(decay, "decay", {rows, heads});
  check_float(beta, "beta", {rows, heads});
  at::Tensor out = at::empty({rows, heads, vd}, v.options());
  const DeltaStepArgs args{state.data_ptr<float>(), slots.data_ptr<int64_t>(),
                           positions.data_ptr<int64_t>(), q.data_ptr<float>(),
                           k.data_ptr<float>(), v.data_ptr<float>(), decay.data_ptr<float>(),
                           beta.data_ptr<float>(), out.data_ptr<float>(), state.size(0),
                           heads, kd, vd};
  std::atomic<bool> ok{true};
  const KernelTable* t = active_table();
  at::parallel_for(0, rows * heads, grain_for(4 * kd * vd), [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>(vd)) scratch.resize(vd);
    if (!t->delta_step(args, t0, t1, scratch.data())) ok = false;
  });
  TORCH_CHECK(ok.load(), "a state slot is outside the state pool of ", state.size(0), " slots");
  return out;
}

// One token of a causal depthwise convolution per row, each row's window updated in place.
at::Tensor conv_step(at::Tensor state, const at::Tensor& slots, const at::Tensor& positions,
                     const at::Tensor& x, const at::Tensor& kernel,
                     const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(state.dim() == 3, "the window must be [slots + 1, channels, taps - 1], got ",
              state.sizes());
  const int64_t channels = state.size(1), taps = state.size(2) + 1, rows = slots.size(0);
  check_float(state, "state", state.sizes());
  check_index(slots, "slots", rows);
  check_index(positions, "positions", rows);
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 &&
                  x.size(0) == rows && x.size(1) == channels && x.stride(1) == 1,
              "x must be float32 [", rows, ", ", channels, "] with unit inner stride, got ",
              x.sizes());
  check_float(kernel, "kernel", {channels, taps});
  if (bias) check_float(*bias, "bias", {channels});
  at::Tensor out = at::empty({rows, channels}, x.options());
  const ConvStepArgs args{state.data_ptr<float>(), slots.data_ptr<int64_t>(),
                          positions.data_ptr<int64_t>(), x.data_ptr<float>(), x.stride(0),
                          kernel.data_ptr<float>(), bias ? bias->data_ptr<float>() : nullptr,
                          out.data_ptr<float>(), state.size(0), channels, taps};
  std::atomic<bool> ok{true};
  const KernelTable* t = active_table();
  at::parallel_for(0, rows, grain_for(2 * channels * taps), [&](int64_t r0, int64_t r1) {
    if (!t->conv_step(args, r0, r1)) ok = false;
  });
  TORCH_CHECK(ok.load(), "a state slot is outside the state pool of ", state.size(0), " slots");
  return out;
}

// One token of Mamba2's state space per row, each row's state updated in place.
at::Tensor ssm_step(at::Tensor state, const at::Tensor& slots, const at::Tensor& positions,
                    const at::Tensor& u, const at::Tensor& b, const at::Tensor& c,
                    const at::Tensor& decay) {
  TORCH_CHECK(state.dim() == 4, "the state must be [slots + 1, heads, head_dim, d_state], got ",
              state.sizes());
  const int64_t heads = state.size(1), hd = state.size(2), ds = state.size(3);
  const int64_t rows = slots.size(0);
  check_float(state, "state", state.sizes());
  TORCH_CHECK(ds % 16 == 0, "d_state ", ds, " is not a multiple of 16");
  check_index(slots, "slots", rows);
  check_index(positions, "positions", rows);
  check_float(u, "u", {rows, heads, hd});
  check_float(b, "b", {rows, heads, ds});
  check_float(c, "c", {rows, heads, ds});
  check_float(decay, "decay", {rows, heads});
  at::Tensor out = at::empty({rows, heads, hd}, u.options());
  const SsmStepArgs args{state.data_ptr<float>(), slots.data_ptr<int64_t>(),
                         positions.data_ptr<int64_t>(), u.data_ptr<float>(), b.data_ptr<float>(),
                         c.data_ptr<float>(), decay.data_ptr<float>(), out.data_ptr<float>(),
                         state.size(0), heads, hd, ds};
  std::atomic<bool> ok{true};
  const KernelTable* t = active_table();
  at::parallel_for(0, rows * heads, grain_for(3 * hd * ds), [&](int64_t t0, int64_t t1) {
    if (!t->ssm_step(args, t0, t1)) ok = false;
  });
  TORCH_CHECK(ok.load(), "a state slot is outside the state pool of ", state.size(0), " slots");
  return out;
}

}  // namespace nanoserve
