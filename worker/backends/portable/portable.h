// Math that runs on the host and on the device: the same function body is
// compiled by the host compiler for the CPU backend and its tests, and by
// nvcc for the CUDA kernels, so CPU tests check what the kernels compute.
// Headers here include no CUDA header and use only what both compilers
// accept (no std:: containers, no exceptions, fixed-size types).
#ifndef TANDEM_WORKER_BACKENDS_PORTABLE_PORTABLE_H_
#define TANDEM_WORKER_BACKENDS_PORTABLE_PORTABLE_H_

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif

#endif  // TANDEM_WORKER_BACKENDS_PORTABLE_PORTABLE_H_
