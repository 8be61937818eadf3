// The recurrent layers' decode steps, written once over simd.h's 16-lane types and included
// per ISA (before kernels.h, whose table names them).
//
// A step updates its row's state in place in the state pool: no gather of the state into a
// copy, no scatter back. Each output number is computed in one fixed order (the state's rows
// in order, fma per lane; a dot of two vectors as a scalar fma chain), so a row's result is
// the same alone or batched and on every ISA. A row at position 0 starts its sequence: it
// reads no state, whatever its slot holds. A row on the sink slot (the pool's last) is
// padding: its output is computed, its state never written (padded rows share the sink).

// -- gated DeltaNet (Qwen3.5) ---------------------------------------------------------------
//
// Per (row, value head), with S the head's [k_dim, v_dim] state, d = exp(g):
//   S' = d S + k delta^T, delta = beta (v - d S^T k)
//   o  = S'^T q = d (S^T q) + delta (k . q)
// S is read once for both of its products (pass 1), then updated in place (pass 2).
bool delta_step(const DeltaStepArgs& a, int64_t t0, int64_t t1, float* delta) {
  const int64_t kd = a.k_dim, vd = a.v_dim, sink = a.num_slots - 1;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t / a.heads, head = t % a.heads, slot = a.slots[row];
    if (slot < 0 || slot > sink) return false;
    float* s = a.state + (slot * a.heads + head) * kd * vd;
    const float* q = a.q + t * kd;
    const float* k = a.k + t * kd;
    const float* v = a.v + t * vd;
    float* o = a.out + t * vd;
    const bool fresh = a.positions[row] == 0;
    const F16 d = f_set1(a.decay[t]), beta = f_set1(a.beta[t]);
    float kq = 0.0f;
    for (int64_t i = 0; i < kd; ++i) kq = std::fma(k[i], q[i], kq);
    const F16 kq16 = f_set1(kq);
    for (int64_t j = 0; j < vd; j += 16) {
      F16 sk = f_zero(), sq = f_zero();  // (S^T k)[j..j+16), (S^T q)[j..j+16)
      if (!fresh) {
        for (int64_t i = 0; i < kd; ++i) {
          const F16 row_i = f_load(s + i * vd + j);
          sk = f_fma(f_set1(k[i]), row_i, sk);
          sq = f_fma(f_set1(q[i]), row_i, sq);
        }
      }
      const F16 dv = f_mul(f_sub(f_load(v + j), f_mul(sk, d)), beta);
      f_store(delta + j, dv);
      f_store(o + j, f_fma(dv, kq16, f_mul(sq, d)));
    }
    if (slot == sink) continue;
    for (int64_t i = 0; i < kd; ++i) {
      float* row_i = s + i * vd;
      const F16 ki = f_set1(k[i]);
      for (int64_t j = 0; j < vd; j += 16) {
        const F16 kept = fresh ? f_zero() : f_mul(f_load(row_i + j), d);
        f_store(row_i + j, f_fma(ki, f_load(delta + j), kept));
      }
    }
  }
  return true;
}

// -- a causal depthwise convolution's step (LFM2's, and DeltaNet's and Mamba2's inputs) ------
//
// Per row and channel, with the window w of the last taps - 1 inputs:
//   y = w[0] k[0] + w[1] k[1] + ... + x k[taps - 1] (+ bias), each product rounded, then added
// in that order (torch's elementwise order in short_conv.py, so the bits are a prompt
// chunk's); then the window shifts by one and takes x.
bool conv_step(const ConvStepArgs& a, int64_t r0, int64_t r1) {
  const int64_t keep = a.taps - 1, channels = a.channels, sink = a.num_slots - 1;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t slot = a.slots[r];
    if (slot < 0 || slot > sink) return false;
    float* window = a.state + slot * channels * keep;
    const float* x = a.x + r * a.x_stride;
    float* out = a.out + r * channels;
    const bool fresh = a.positions[r] == 0, padding = slot == sink;
    for (int64_t c = 0; c < channels; ++c) {
      float* past = window + c * keep;
      const float* w = a.kernel + c * a.taps;
      float y = (fresh ? 0.0f : past[0]) * w[0];
      for (int64_t t = 1; t < keep; ++t) y = y + (fresh ? 0.0f : past[t]) * w[t];
      y = y + x[c] * w[keep];
      if (a.bias != nullptr) y = y + a.bias[c];
      out[c] = y;
      if (padding) continue;
      for (int64_t t = 0; t + 1 < keep; ++t) past[t] = fresh ? 0.0f : past[t + 1];
      past[keep - 1] = x[c];
    }
  }
  return true;
}

// -- Mamba2's selective state space (Granite 4.0-H) -------------------------------------------
//
// Per (row, head), with S the head's [head_dim, d_state] state and u = dt x:
//   S' = decay S + u b^T,  y = S' c
// one pass over S: each of its rows updated in place, then dotted with c (16 lanes, then
// simd.h's fixed tree).
bool ssm_step(const SsmStepArgs& a, int64_t t0, int64_t t1) {
  const int64_t hd = a.head_dim, ds = a.d_state, sink = a.num_slots - 1;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t / a.heads, head = t % a.heads, slot = a.slots[row];
    if (slot < 0 || slot > sink) return false;
    float* s = a.state + (slot * a.heads + head) * hd * ds;
    const float* u = a.u + t * hd;
    const float* b = a.b + t * ds;
    const float* c = a.c + t * ds;
    float* y = a.out + t * hd;
    const bool fresh = a.positions[row] == 0, padding = slot == sink;
    const F16 decay = f_set1(a.decay[t]);
    for (int64_t p = 0; p < hd; ++p) {
      float* row_p = s + p * ds;
      const F16 up = f_set1(u[p]);
      F16 acc = f_zero();
      for (int64_t n = 0; n < ds; n += 16) {
        const F16 kept = fresh ? f_zero() : f_mul(f_load(row_p + n), decay);
        const F16 next = f_fma(up, f_load(b + n), kept);
        if (!padding) f_store(row_p + n, next);
        acc = f_fma(next, f_load(c + n), acc);
      }
      y[p] = f_hsum(acc);
    }
  }
  return true;
}
