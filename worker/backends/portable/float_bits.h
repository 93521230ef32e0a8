// Float bit casts and arithmetic that rounds each operation, on the host and
// on the device. nvcc contracts `a * b + c` into one fused multiply-add by
// default (one rounding instead of two), which the host build (x86-64
// without FMA, ISO C++ so no contraction) never does; the functions here
// keep the two roundings on the device too, so a kernel computes the same
// bits as the host code CPU tests check.
#ifndef TANDEM_WORKER_BACKENDS_PORTABLE_FLOAT_BITS_H_
#define TANDEM_WORKER_BACKENDS_PORTABLE_FLOAT_BITS_H_

#include <cstdint>
#include <cstring>

#include "worker/backends/portable/portable.h"

namespace tandem::worker::portable {

TANDEM_HD uint32_t FloatAsBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

TANDEM_HD float BitsAsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

// a * b, rounded to nearest even, never fused with a following add.
TANDEM_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// a + b, rounded to nearest even, never fused with a preceding multiply.
TANDEM_HD float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// a - b, likewise.
TANDEM_HD float SubRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

}  // namespace tandem::worker::portable

#endif  // TANDEM_WORKER_BACKENDS_PORTABLE_FLOAT_BITS_H_
