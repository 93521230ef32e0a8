// Software prefetches that the compiler keeps.
//
// GCC treats __builtin_prefetch (and _mm_prefetch, built on it) as free of
// side effects, so a function that does nothing but prefetch is deduced
// const or pure, and a call to it whose result is unused is deleted: until
// 2026-12-05 the quantized kernels' PrefetchAhead and attention's burst
// over an item's rows (each a small function of a branch and a loop)
// compiled to nothing, whatever QuantPrefetchBytes said, while a prefetch
// written in a loop's own body survived. (The burst, once issued, cost
// attention time and was removed.) An asm statement marked volatile is a side
// effect the optimizer must keep, wherever it is inlined (checked with
// objdump: quant_gemm_avx2.o went from 0 prefetches to 40).
//
// Thread-safe: no state.
#ifndef TANDEM_WORKER_BACKENDS_CPU_PREFETCH_H_
#define TANDEM_WORKER_BACKENDS_CPU_PREFETCH_H_

namespace tandem::worker::cpu {

// Asks for the cache line holding p into L2 and the levels below it (T1;
// T0, into L1 too, lost to it wherever measured: quant_gemm.h and
// cpu_math.h). Never faults, whatever p is.
inline void PrefetchT1(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

}  // namespace tandem::worker::cpu

#endif  // TANDEM_WORKER_BACKENDS_CPU_PREFETCH_H_
