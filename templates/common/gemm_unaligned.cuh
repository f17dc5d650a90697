// A slow, always-correct GEMM for operands the fast kernels cannot take: base addresses or
// leading dimensions that break the 16-byte rule of cp.async/TMA. Plain loads of single elements
// into shared memory, fp32 FMA, fp32 accumulators (int8: int32 multiply-adds, exact as the tensor cores' s32
// sums); the same layout constants as the fast kernel.
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

// Per-block scales (fp8, scale="block"): an element of A (B) times the scale of its row (128-column block) and k
// block, row `row` of the row-major fp32 matrix in epilogue slot `slot`; so that the products of one k block come
// out times both scales, as the fast kernel's promotion gives them. Without block scales: the value itself.
template <class Cfg, typename V>
__device__ __forceinline__ V times_block_scale(const GemmArgs& args, int slot, int64_t row, int64_t k, V value) {
  if constexpr (Cfg::Epilogue::kRowBlocksSlot >= 0) {
    const float* scales = static_cast<const float*>(args.ep_ptr[slot]);
    return value * scales[row * args.ep_ld[slot] + k / Cfg::Epilogue::kScaleBlockK];
  } else {
    return value;
  }
}

// An input element as the accumulation takes it: fp32, or int32 for int8.
template <typename Elem>
using Value = std::conditional_t<std::is_same_v<Elem, int8_t>, int32_t, float>;

template <typename Elem>
__device__ __forceinline__ Value<Elem> to_value(Elem x) {
  if constexpr (std::is_same_v<Elem, int8_t>) {
    return x;
  } else {
    return to_float(x);
  }
}

template <class Cfg>
__device__ __forceinline__ void run(const GemmArgs& args) {
  using Elem = typename Cfg::Elem;
  using Out = typename Cfg::Out;
  using V = Value<Elem>;
  __shared__ V a_tile[kBlockK][kTile + 1];
  __shared__ V b_tile[kBlockK][kTile + 1];
  const Elem* a = static_cast<const Elem*>(args.a);
  const typename Cfg::ElemB* b = static_cast<const typename Cfg::ElemB*>(args.b);
  Out* d = static_cast<Out*>(args.d);
  const int64_t M = args.m, N = args.n, K = args.k;
  const int64_t tiles_n = (N + kTile - 1) / kTile;
  const int64_t m0 = (blockIdx.x / tiles_n) * kTile, n0 = (blockIdx.x % tiles_n) * kTile;
  const int tx = threadIdx.x % kThreadsPerSide, ty = threadIdx.x / kThreadsPerSide;

  V acc[kPerThread][kPerThread] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
    for (int i = threadIdx.x; i < kTile * kBlockK; i += kThreads) {
      const int mn = i % kTile, kk = i / kTile;
      const int64_t m = m0 + mn, n = n0 + mn, k = k0 + kk;
      const bool k_ok = k < K;
      a_tile[kk][mn] = (k_ok && m < M)
          ? times_block_scale<Cfg>(args, Cfg::Epilogue::kRowBlocksSlot, m, k,
                                   to_value(a[Cfg::kAKMajor ? m * args.lda + k : k * args.lda + m]))
          : V(0);
      b_tile[kk][mn] = (k_ok && n < N)
          ? times_block_scale<Cfg>(args, Cfg::Epilogue::kColBlocksSlot, n / Cfg::Epilogue::kScaleBlockK, k,
                                   to_value(b[Cfg::kBKMajor ? n * args.ldb + k : k * args.ldb + n]))
          : V(0);
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
      // (the store's index after the epilogue: computed before it, it stays live across it and ptxas spills)
      if constexpr (std::is_same_v<Out, int32_t>) {
        d[Cfg::kDRowMajor ? m * args.ldd + n : n * args.ldd + m] = acc[i][j];   // int8's exact sums (no epilogue)
      } else {
        float value = static_cast<float>(acc[i][j]);
        if constexpr (!Cfg::Epilogue::kIdentity) value = Cfg::Epilogue::apply(args, value, m, n);
        d[Cfg::kDRowMajor ? m * args.ldd + n : n * args.ldd + m] = from_float<Out>(value);
      }
    }
}

}  // namespace unaligned
}  // namespace gemmgen
