// A slow, always-correct GEMM for operands the fast kernels cannot take: base addresses or
// leading dimensions that break the 16-byte rule of cp.async/TMA. Plain loads of single elements
// into shared memory, fp32 FMA, fp32 accumulators; the same layout constants as the fast kernel.
#pragma once

#include <cstdint>

#include "convert.cuh"
#include "gemm_args.h"

namespace gemmgen {
namespace unaligned {

constexpr int kTile = 64;              // output tile is kTile x kTile
constexpr int kBlockK = 16;
constexpr int kThreadsPerSide = 16;    // 16 x 16 threads, each computing 4 x 4 outputs
constexpr int kThreads = kThreadsPerSide * kThreadsPerSide;
constexpr int kPerThread = kTile / kThreadsPerSide;

template <class Cfg>
__device__ __forceinline__ void run(const GemmArgs& args) {
  using Elem = typename Cfg::Elem;
  using Out = typename Cfg::Out;
  __shared__ float a_tile[kBlockK][kTile + 1];
  __shared__ float b_tile[kBlockK][kTile + 1];
  const Elem* a = static_cast<const Elem*>(args.a);
  const Elem* b = static_cast<const Elem*>(args.b);
  Out* d = static_cast<Out*>(args.d);
  const int64_t M = args.m, N = args.n, K = args.k;
  const int64_t tiles_n = (N + kTile - 1) / kTile;
  const int64_t m0 = (blockIdx.x / tiles_n) * kTile, n0 = (blockIdx.x % tiles_n) * kTile;
  const int tx = threadIdx.x % kThreadsPerSide, ty = threadIdx.x / kThreadsPerSide;

  float acc[kPerThread][kPerThread] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
    for (int i = threadIdx.x; i < kTile * kBlockK; i += kThreads) {
      const int mn = i % kTile, kk = i / kTile;
      const int64_t m = m0 + mn, n = n0 + mn, k = k0 + kk;
      const bool k_ok = k < K;
      a_tile[kk][mn] = (k_ok && m < M) ? to_float(a[Cfg::kAKMajor ? m * args.lda + k : k * args.lda + m]) : 0.f;
      b_tile[kk][mn] = (k_ok && n < N) ? to_float(b[Cfg::kBKMajor ? n * args.ldb + k : k * args.ldb + n]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBlockK; ++kk)
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kPerThread; ++j)
          acc[i][j] += a_tile[kk][ty + i * kThreadsPerSide] * b_tile[kk][tx + j * kThreadsPerSide];
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i)
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t m = m0 + ty + i * kThreadsPerSide, n = n0 + tx + j * kThreadsPerSide;
      if (m >= M || n >= N) continue;
      float value = acc[i][j];
      if constexpr (!Cfg::Epilogue::kIdentity) value = Cfg::Epilogue::apply(args, value, m, n);
      d[Cfg::kDRowMajor ? m * args.ldd + n : n * args.ldd + m] = from_float<Out>(value);
    }
}

}  // namespace unaligned
}  // namespace gemmgen
