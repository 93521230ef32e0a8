// Rotary position embedding, on the host and on the device, in the CPU
// backend's convention (CpuBackend::Rope, backend.h's RopeParams):
//  * pair i of a head (i < rope_dim / 2) is the adjacent elements (2i, 2i+1)
//    (ggml's "normal" RoPE: GGUF Llama weights are permuted for it), the
//    dims past rope_dim are left as they are;
//  * inv_freq_i = freq_base ^ (-2 i / rope_dim), in float;
//  * angle = (position * freq_scale) * inv_freq_i (linear scaling), in float;
//  * (a, b) -> (a cos - b sin, a sin + b cos).
// The operations are the CPU backend's, in its order and precision, so on the
// host RopeHead reproduces CpuBackend::Rope bit for bit (rope_test.cc). The
// CUDA launcher computes inv_freq on the host with RopeInvFreq and passes the
// table to the kernel: the device's powf may differ from the host's by a few
// ulps, which at position 30000 would turn the angle by 1e-3 rad. What is
// left on the device is cosf/sinf (within 2 ulp of the host's); each
// multiply and add is rounded separately (float_bits.h), as on the host.
//
// Thread-safe: pure functions.
#ifndef TANDEM_WORKER_BACKENDS_PORTABLE_ROPE_H_
#define TANDEM_WORKER_BACKENDS_PORTABLE_ROPE_H_

#include <math.h>

#include <cstdint>

#include "worker/backends/portable/float_bits.h"
#include "worker/backends/portable/portable.h"

namespace tandem::worker::portable {

TANDEM_HD float RopeInvFreq(float freq_base, int32_t pair, int32_t rope_dim) {
  return powf(freq_base, -2.0f * static_cast<float>(pair) / static_cast<float>(rope_dim));
}

// cos and sin of the angle (position * freq_scale) * inv_freq.
TANDEM_HD void RopeCosSin(int32_t position, float freq_scale, float inv_freq, float* cos_out, float* sin_out) {
  const float angle = MulRn(MulRn(static_cast<float>(position), freq_scale), inv_freq);
  *cos_out = cosf(angle);
  *sin_out = sinf(angle);
}

// Rotates the pair (*a, *b) by the angle whose cos and sin are given.
TANDEM_HD void RopeRotatePair(float* a, float* b, float cos, float sin) {
  const float x = *a;
  const float y = *b;
  *a = SubRn(MulRn(x, cos), MulRn(y, sin));
  *b = AddRn(MulRn(x, sin), MulRn(y, cos));
}

// One head of head_dim floats at `position` (the host model of the kernel,
// which runs RopeCosSin and RopeRotatePair once per pair and thread, with
// the launcher's RopeInvFreq table).
// REQUIRES: rope_dim even and <= the head's size.
TANDEM_HD void RopeHead(float* head, int32_t rope_dim, int32_t position, float freq_base, float freq_scale) {
  for (int32_t i = 0; i < rope_dim / 2; ++i) {
    float c, s;
    RopeCosSin(position, freq_scale, RopeInvFreq(freq_base, i, rope_dim), &c, &s);
    RopeRotatePair(head + 2 * i, head + 2 * i + 1, c, s);
  }
}

}  // namespace tandem::worker::portable

#endif  // TANDEM_WORKER_BACKENDS_PORTABLE_ROPE_H_
