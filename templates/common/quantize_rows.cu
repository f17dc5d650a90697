// gemmgen's fp8 quantization of a matrix's rows on the GPU, for generator.quantize on a CUDA tensor:
// - in 1x128 blocks (DeepSeek's activation layout, what the fp8 GEMMs with scale="block" read as A), one pass over
//   x: quantize(x, fp8, scale="block") where the rows are whole blocks; a warp takes one block;
// - by whole rows (the rowwise scales torch._scaled_mm and the fp8 GEMMs with scale="row" read), x read twice, the
//   second time from cache: quantize(x, fp8, scale="row"); a CTA takes one row.
// The torch path (generator/quantization.py) is two to eight passes over x and an fp32 copy of it.
//
// Bit for bit what the torch path computes (tests/gpu/test_quantize_kernel_gpu.py): per block of a row (128 columns,
// or the whole row), amax = max |x| (NaN if any element is NaN, as torch.amax; a maximum, so the order the threads
// combine it in does not change it), s = max(amax, FLT_MIN) / fmax (IEEE division, as torch divides by a tensor),
// q = clamp(x / s, -fmax, fmax) (IEEE division; NaN stays NaN, as torch.clamp), rounded to the nearest fp8 value.
// Each lane takes four neighbouring columns.
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
constexpr int kWarpsPerCta = kThreadsPerCta / kWarpThreads;

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

// The largest magnitude among a lane's four elements.
__device__ __forceinline__ float amax4(const float (&v)[kColumnsPerLane]) {
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < kColumnsPerLane; ++e) amax = max_keeping_nan(amax, fabsf(v[e]));
  return amax;
}

// The largest magnitude over the warp, in every lane (a butterfly of shuffles).
__device__ __forceinline__ float warp_amax(float amax) {
#pragma unroll
  for (int offset = kWarpThreads / 2; offset > 0; offset /= 2)
    amax = max_keeping_nan(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  return amax;
}

// The dequantizing scale of a block whose largest magnitude is amax (torch: amax.clamp_min(tiny) / fmax).
__device__ __forceinline__ float block_scale(float amax, float fmax) {
  return __fdiv_rn(amax != amax ? amax : fmaxf(amax, FLT_MIN), fmax);
}

// The first element of row `row` of x (ld_x elements apart, of the input type's width).
__device__ __forceinline__ const void* row_start(const void* x, int type, int64_t ld_x, int64_t row) {
  return static_cast<const char*>(x) + row * ld_x * (type == kFloat32 ? 4 : 2);
}

// Round to the nearest fp8 value. The values are within +-fmax (or NaN), where saturation never applies.
__device__ __forceinline__ uint8_t to_fp8(float v, int fp8) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, fp8 == kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

// A lane's four elements divided by the block's scale, clamped, rounded to fp8 and packed in column order.
__device__ __forceinline__ uint32_t pack_fp8(const float (&v)[kColumnsPerLane], float scale, float fmax, int fp8) {
  uint32_t packed = 0;
#pragma unroll
  for (int e = 0; e < kColumnsPerLane; ++e)
    packed |= static_cast<uint32_t>(to_fp8(clamp_keeping_nan(__fdiv_rn(v[e], scale), fmax), fp8)) << (8 * e);
  return packed;
}

// x: rows x (blocks * 128), row stride ld_x elements; q: rows x (blocks * 128) fp8, dense; s: rows x blocks fp32, dense.
__global__ void __launch_bounds__(kThreadsPerCta) quantize_row_blocks(const void* x, int type, int64_t ld_x,
                                                                      uint8_t* q, float* s, int fp8, float fmax,
                                                                      int64_t rows, int64_t blocks) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreadsPerCta + threadIdx.x) / kWarpThreads;
  const int lane = threadIdx.x % kWarpThreads;
  if (warp >= rows * blocks) return;  // (the last CTA's warps past the last block)
  const int64_t row = warp / blocks, column = (warp % blocks) * kBlockColumns + lane * kColumnsPerLane;
  const void* x_row = row_start(x, type, ld_x, row);
  float v[kColumnsPerLane];
  load4(x_row, column, type, v);
  const float scale = block_scale(warp_amax(amax4(v)), fmax);
  *reinterpret_cast<uint32_t*>(q + row * blocks * kBlockColumns + column) = pack_fp8(v, scale, fmax, fp8);
  if (lane == 0) s[warp] = scale;
}

// x: rows x cols (cols a multiple of 4), row stride ld_x elements; q: rows x cols fp8, dense; s: rows fp32. One CTA
// per row: the CTA's largest magnitude (each lane over its columns, then the warps, then the CTA through shared
// memory), then the row again, quantized (a row of up to tens of KB is still in L1 or L2 the second time).
__global__ void __launch_bounds__(kThreadsPerCta) quantize_whole_rows(const void* x, int type, int64_t ld_x,
                                                                      uint8_t* q, float* s, int fp8, float fmax,
                                                                      int64_t cols) {
  __shared__ float warp_amaxes[kWarpsPerCta];
  const int64_t row = blockIdx.x;
  const void* x_row = row_start(x, type, ld_x, row);
  constexpr int kColumnsPerCtaStep = kThreadsPerCta * kColumnsPerLane;
  float amax = 0.f;
  for (int64_t column = threadIdx.x * kColumnsPerLane; column < cols; column += kColumnsPerCtaStep) {
    float v[kColumnsPerLane];
    load4(x_row, column, type, v);
    amax = max_keeping_nan(amax, amax4(v));
  }
  amax = warp_amax(amax);
  if (threadIdx.x % kWarpThreads == 0) warp_amaxes[threadIdx.x / kWarpThreads] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarpsPerCta; ++w) amax = max_keeping_nan(amax, warp_amaxes[w]);
  const float scale = block_scale(amax, fmax);
  uint8_t* q_row = q + row * cols;
  for (int64_t column = threadIdx.x * kColumnsPerLane; column < cols; column += kColumnsPerCtaStep) {
    float v[kColumnsPerLane];
    load4(x_row, column, type, v);
    *reinterpret_cast<uint32_t*>(q_row + column) = pack_fp8(v, scale, fmax, fp8);
  }
  if (threadIdx.x == 0) s[row] = scale;
}

}  // namespace

extern "C" {

// Launch on `stream`; returns a cudaError_t (0: launched). The caller checks shapes, strides and alignment: x's rows
// start on a whole vector of 4 elements (8 bytes of 16-bit input, 16 of fp32; ld_x a multiple of 4); q and s are
// dense.
int gemmgen_quantize_row_blocks(const void* x, int type, int64_t ld_x, void* q, float* s, int fp8, float fmax,
                                int64_t rows, int64_t blocks, cudaStream_t stream) {
  const int64_t warps = rows * blocks;
  if (warps == 0) return 0;
  const int64_t ctas = (warps * kWarpThreads + kThreadsPerCta - 1) / kThreadsPerCta;
  quantize_row_blocks<<<static_cast<unsigned>(ctas), kThreadsPerCta, 0, stream>>>(
      x, type, ld_x, static_cast<uint8_t*>(q), s, fp8, fmax, rows, blocks);
  return static_cast<int>(cudaGetLastError());
}

// Whole rows: x rows x cols (cols a multiple of 4, rows below 2^31), the same alignment rule; q dense, s (rows,).
int gemmgen_quantize_rows(const void* x, int type, int64_t ld_x, void* q, float* s, int fp8, float fmax,
                          int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return 0;
  quantize_whole_rows<<<static_cast<unsigned>(rows), kThreadsPerCta, 0, stream>>>(
      x, type, ld_x, static_cast<uint8_t*>(q), s, fp8, fmax, cols);
  return static_cast<int>(cudaGetLastError());
}

const char* gemmgen_quantize_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // extern "C"
