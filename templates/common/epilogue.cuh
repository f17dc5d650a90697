// The building blocks of a fused epilogue: what a rendered `Epilogue` functor (see render/epilogue.py)
// calls to read its operands and to compute its activations, in fp32, one accumulator element at a time.
//
// Accuracy. The activations use the fast hardware approximations where their error stays below the
// rounding of a 16-bit output, and the accurate library functions for fp32 outputs:
// tanh.approx.f32 has a maximum relative error of 2^-10.987 (PTX ISA), below bf16's half ulp (2^-9)
// and about fp16's (2^-11); ex2.approx.f32 (under __expf) is accurate to 2 ulp of fp32.
#pragma once

#include <cstdint>
#include <cstring>

#include "convert.cuh"
#include "ptx/sm80.cuh"

namespace gemmgen {
namespace epi {

// tanh: the approximation for 16-bit outputs (FAST), tanhf for fp32 ones.
template <bool FAST>
__device__ __forceinline__ float tanh(float x) {
  if constexpr (FAST) return ptx::tanh_approx(x);
  else return ::tanhf(x);
}

// sigmoid(x) = 0.5 tanh(x / 2) + 0.5: one MUFU operation and two FP32 ones on the fast path.
template <bool FAST>
__device__ __forceinline__ float sigmoid(float x) {
  if constexpr (FAST) return fmaf(0.5f, ptx::tanh_approx(0.5f * x), 0.5f);
  else return 1.0f / (1.0f + ::expf(-x));
}

__device__ __forceinline__ float relu(float x) { return fmaxf(x, 0.0f); }

__device__ __forceinline__ float leaky_relu(float x, float slope) { return x > 0.0f ? x : x * slope; }

// GELU, the exact form: x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))).
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + ::erff(x * 0.70710678118654752f)); }

// GELU, the tanh form (torch's approximate="tanh"): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))),
// as x (c0 + c1 x^2) inside the tanh and h + h tanh(.) with h = x / 2 outside: six operations, one MUFU.
template <bool FAST>
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kC0 = 0.79788456080286536f;             // sqrt(2 / pi)
  constexpr float kC1 = 0.79788456080286536f * 0.044715f;
  const float inner = x * fmaf(kC1, x * x, kC0);
  const float half = 0.5f * x;
  return fmaf(half, tanh<FAST>(inner), half);
}

// SiLU (swish): x * sigmoid(x). (h + h tanh(h) with h = x / 2 is one operation shorter, but ptxas then
// spills beside a matrix operand and the accumulators of a 128x256 tile.)
template <bool FAST>
__device__ __forceinline__ float silu(float x) { return x * sigmoid<FAST>(x); }

// An operand element, read through the non-coherent (read-only) cache: the operands are inputs the
// kernel never writes, and every element of a per-row or per-column vector is read by many threads.
// 16-bit types are read as their bits through the builtin __ldg of unsigned short: the compiler merges two
// reads of one element (cuda_bf16.h's __ldg overloads are inline asm, which it does not merge).
template <typename T>
__device__ __forceinline__ float load(const void* base, int64_t index) {
  if constexpr (sizeof(T) == 2) {
    const unsigned short bits = __ldg(static_cast<const unsigned short*>(base) + index);
    T value;
    memcpy(&value, &bits, sizeof(value));
    return to_float<T>(value);
  } else {
    return to_float<T>(__ldg(static_cast<const T*>(base) + index));
  }
}

// Elements index and index + 1 (index even, the base aligned to two elements) with one load.
template <typename T>
__device__ __forceinline__ float2 load_pair(const void* base, int64_t index) {
  const T* at = static_cast<const T*>(base) + index;
  if constexpr (sizeof(T) == 2) {
    return unpack<T>(__ldg(reinterpret_cast<const unsigned int*>(at)));
  } else {
    return __ldg(reinterpret_cast<const float2*>(at));
  }
}

template <typename T>
__device__ __forceinline__ void store(void* base, int64_t index, float value) {
  static_cast<T*>(base)[index] = from_float<T>(value);
}

// Ask L2 for the part of an M x N operand that a tile of D will read (rows [row0, row0 + rows) x columns
// [col0, col0 + cols), clipped to m x n), one 128-byte line per request, spread over `threads` threads. Issued
// when the tile's main loop starts, the lines arrive while it runs: the epilogue then reads them from L2
// instead of all blocks reading DRAM at once when their main loops end.
template <typename T, bool ROW_MAJOR>
__device__ __forceinline__ void prefetch_tile_l2(const void* base, int64_t ld, int64_t row0, int rows, int64_t col0,
                                                 int cols, int64_t m, int64_t n, int thread, int threads) {
  constexpr int kLineBytes = 128;
  // Lines of one contiguous run (a row of a row-major operand, a column of a column-major one).
  const int64_t outer0 = ROW_MAJOR ? row0 : col0, outer_end = ROW_MAJOR ? min(row0 + rows, m) : min(col0 + cols, n);
  const int64_t inner0 = ROW_MAJOR ? col0 : row0, inner_end = ROW_MAJOR ? min(col0 + cols, n) : min(row0 + rows, m);
  if (outer_end <= outer0 || inner_end <= inner0) return;
  const int lines = static_cast<int>((inner_end - inner0) * static_cast<int64_t>(sizeof(T)) / kLineBytes) + 2;
  const int64_t runs = outer_end - outer0;
  for (int64_t i = thread; i < runs * lines; i += threads) {
    const int64_t run = outer0 + i / lines;
    const char* first = static_cast<const char*>(base) + (run * ld + inner0) * static_cast<int64_t>(sizeof(T));
    const char* last = static_cast<const char*>(base) + (run * ld + inner_end - 1) * static_cast<int64_t>(sizeof(T));
    const char* line = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(first) & ~uintptr_t{kLineBytes - 1}) +
                       (i % lines) * kLineBytes;
    if (line <= last) ptx::prefetch_l2(line);
  }
}

}  // namespace epi
}  // namespace gemmgen
