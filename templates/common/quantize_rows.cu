// gemmgen's fp8 quantization of activations in 1x128 blocks (DeepSeek's layout, what the fp8 GEMMs with
// scale="block" read as A), in one pass: generator.quantize(x, fp8, scale="block") on a CUDA tensor whose rows are
// whole blocks. The torch path (generator/quantization.py) is about eight passes over x.
//
// Bit for bit what the torch path computes (tests/gpu/test_quantize_kernel.py): per block of 128 columns of a row,
// amax = max |x| (NaN if any element is NaN, as torch.amax), s = max(amax, FLT_MIN) / fmax (IEEE division, as torch
// divides by a tensor), q = clamp(x / s, -fmax, fmax) (IEEE division; NaN stays NaN, as torch.clamp), rounded to the
// nearest fp8 value. A warp takes one block, each lane four neighbouring columns.
#include <cfloat>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

namespace {

constexpr int kBlockColumns = 128;
constexpr int kWarpThreads = 32;
constexpr int kColumnsPerLane = kBlockColumns / kWarpThreads;  // 4
constexpr int kThreadsPerCta = 256;

enum InputType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum Fp8Type : int { kE4M3 = 0, kE5M2 = 1 };

// The larger of two magnitudes, NaN if either is NaN (fmaxf would drop the NaN; torch.amax keeps it).
__device__ __forceinline__ float max_keeping_nan(float a, float b) { return (a != a || b != b) ? NAN : fmaxf(a, b); }

// clamp(v, -limit, limit) that leaves NaN as it is (as torch.clamp).
__device__ __forceinline__ float clamp_keeping_nan(float v, float limit) {
  return v != v ? v : fminf(fmaxf(v, -limit), limit);
}

// Four neighbouring elements of one row as floats (exact: each input type widens to fp32 without rounding).
__device__ __forceinline__ void load4(const void* row, int64_t column, int type, float (&v)[kColumnsPerLane]) {
  if (type == kFloat32) {
    const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(row) + column);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else if (type == kFloat16) {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __half*>(row) + column);
    const __half2 lo = *reinterpret_cast<const __half2*>(&raw.x), hi = *reinterpret_cast<const __half2*>(&raw.y);
    v[0] = __low2float(lo), v[1] = __high2float(lo), v[2] = __low2float(hi), v[3] = __high2float(hi);
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(row) + column);
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
    const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
    v[0] = __low2float(lo), v[1] = __high2float(lo), v[2] = __low2float(hi), v[3] = __high2float(hi);
  }
}

// Round to the nearest fp8 value. The values are within +-fmax (or NaN), where saturation never applies.
__device__ __forceinline__ uint8_t to_fp8(float v, int fp8) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, fp8 == kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

// x: rows x (blocks * 128), row stride ld_x elements; q: rows x (blocks * 128) fp8, dense; s: rows x blocks fp32, dense.
__global__ void __launch_bounds__(kThreadsPerCta) quantize_row_blocks(const void* x, int type, int64_t ld_x,
                                                                      uint8_t* q, float* s, int fp8, float fmax,
                                                                      int64_t rows, int64_t blocks) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreadsPerCta + threadIdx.x) / kWarpThreads;
  const int lane = threadIdx.x % kWarpThreads;
  if (warp >= rows * blocks) return;  // (the last CTA's warps past the last block)
  const int64_t row = warp / blocks, column = (warp % blocks) * kBlockColumns + lane * kColumnsPerLane;
  const int element_bytes = type == kFloat32 ? 4 : 2;
  const void* x_row = static_cast<const char*>(x) + row * ld_x * element_bytes;
  float v[kColumnsPerLane];
  load4(x_row, column, type, v);
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < kColumnsPerLane; ++e) amax = max_keeping_nan(amax, fabsf(v[e]));
#pragma unroll
  for (int offset = kWarpThreads / 2; offset > 0; offset /= 2)
    amax = max_keeping_nan(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float scale = __fdiv_rn(amax != amax ? amax : fmaxf(amax, FLT_MIN), fmax);
  uint32_t packed = 0;
#pragma unroll
  for (int e = 0; e < kColumnsPerLane; ++e)
    packed |= static_cast<uint32_t>(to_fp8(clamp_keeping_nan(__fdiv_rn(v[e], scale), fmax), fp8)) << (8 * e);
  *reinterpret_cast<uint32_t*>(q + row * blocks * kBlockColumns + column) = packed;
  if (lane == 0) s[warp] = scale;
}

}  // namespace

extern "C" {

// Launch on `stream`; returns a cudaError_t (0: launched). The caller checks shapes, strides and alignment: x's rows
// start 16-byte aligned (ld_x a multiple of 4 fp32 or 8 16-bit elements), q and s are dense.
int gemmgen_quantize_row_blocks(const void* x, int type, int64_t ld_x, void* q, float* s, int fp8, float fmax,
                                int64_t rows, int64_t blocks, cudaStream_t stream) {
  const int64_t warps = rows * blocks;
  if (warps == 0) return 0;
  const int64_t ctas = (warps * kWarpThreads + kThreadsPerCta - 1) / kThreadsPerCta;
  quantize_row_blocks<<<static_cast<unsigned>(ctas), kThreadsPerCta, 0, stream>>>(
      x, type, ld_x, static_cast<uint8_t*>(q), s, fp8, fmax, rows, blocks);
  return static_cast<int>(cudaGetLastError());
}

const char* gemmgen_quantize_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
