// The mma.sync m16n8k16 ceiling of this GPU, per second and per clock: every warp issues independent
// chains of mma.sync from registers, nothing else (no shared or global memory in the loop). Built and
// driven by gpu/mma_ceiling.py, which times it over a steady stretch and samples the SM clock and power.
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../templates/ptx/sm80.cuh"

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kChains = 8;  // independent accumulators per warp: enough to cover the HMMA latency

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) mma_ceiling_kernel(const uint32_t* seed, float* out, int iters) {
  const int lane = threadIdx.x % 32;
  uint32_t a[4], b[kChains][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = seed[lane * 4 + i];
#pragma unroll
  for (int c = 0; c < kChains; ++c) {
    b[c][0] = seed[128 + (lane + c) % 32];
    b[c][1] = seed[160 + (lane + 3 * c) % 32];
  }
  float acc[kChains][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) gemmgen::ptx::MmaM16N8K16<T>::run(acc[c], a, b[c]);
  }
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) sum += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;  // keeps every chain live
}

}  // namespace

// seed: 192 words of random 16-bit pairs; out: blocks * kWarpsPerBlock * 32 floats. Returns a cudaError_t.
extern "C" int mma_ceiling_launch(int bf16, int blocks, int iters, const uint32_t* seed, float* out,
                                  cudaStream_t stream) {
  if (bf16)
    mma_ceiling_kernel<__nv_bfloat16><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(seed, out, iters);
  else
    mma_ceiling_kernel<__half><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(seed, out, iters);
  return static_cast<int>(cudaGetLastError());
}

// FLOP of one launch: 2 * 16 * 8 * 16 per mma.
extern "C" double mma_ceiling_flop(int blocks, int iters) {
  return 2.0 * 16 * 8 * 16 * kChains * kWarpsPerBlock * static_cast<double>(blocks) * iters;
}
