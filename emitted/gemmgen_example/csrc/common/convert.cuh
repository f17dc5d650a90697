// Conversions from fp32 accumulators to the output element type, one overload per type.
#pragma once

#include <cstdint>
#include <cstring>  // memcpy
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace gemmgen {

// The first `count` elements of the 16-byte chunk at `src` (count < the chunk's elements), zeros after: a chunk that
// crosses the end of a row, a column or the operand itself, read element by element so that nothing past its
// valid elements is touched (a 16-byte access there may lie past the allocation). Constant indices: the chunk
// stays in registers.
template <typename Elem>
__device__ __forceinline__ uint4 chunk_head(const Elem* src, int count) {
  constexpr int kElems = static_cast<int>(sizeof(uint4) / sizeof(Elem));
  union {
    uint4 bits;
    Elem elems[kElems];
  } chunk;
  chunk.bits = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < kElems; ++i) {
    if (i < count) chunk.elems[i] = src[i];
  }
  return chunk.bits;
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
// fp8 D (a quantized output, whose values the epilogue has already scaled into range): round to nearest even,
// saturated to the largest finite value (cvt.rn.satfinite, PTX ISA §9.7.9.21), as torch's casts of clamped values.
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) { return __nv_fp8_e4m3(x); }
template <>
__device__ __forceinline__ __nv_fp8_e5m2 from_float<__nv_fp8_e5m2>(float x) { return __nv_fp8_e5m2(x); }

// The fp8 types (a quantized D: the epilogue scales it per block, sm90/gemm_kernel.cuh quantize_out).
template <typename T>
constexpr bool kIsFp8 = std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;
// The largest finite value of an fp8 type: a block's largest magnitude is scaled to it.
template <typename T>
constexpr float kFp8Max = std::is_same_v<T, __nv_fp8_e4m3> ? 448.0f : 57344.0f;

// D's element from an accumulator register after the epilogue. An int32 D comes only from an int8 GEMM without
// an epilogue (generator/spec/config.py check_int8), whose registers hold the tensor cores' exact int32 sums as
// bits (the s32 mma/wgmma wrappers write them so): stored as they are.
template <typename Out>
__device__ __forceinline__ Out from_accumulator(float reg) {
  if constexpr (std::is_same_v<Out, int32_t>) {
    return __float_as_int(reg);
  } else {
    return from_float<Out>(reg);
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_fp8_e4m3>(__nv_fp8_e4m3 x) { return static_cast<float>(x); }
template <>
__device__ __forceinline__ float to_float<__nv_fp8_e5m2>(__nv_fp8_e5m2 x) { return static_cast<float>(x); }

// Two neighbouring outputs stored with one access (4 bytes for 16-bit types, 8 for fp32).
template <typename T>
struct Pair;
template <>
struct Pair<float> {
  using type = float2;
  __device__ __forceinline__ static float2 make(float x, float y) { return make_float2(x, y); }
};
template <>
struct Pair<__half> {
  using type = __half2;
  __device__ __forceinline__ static __half2 make(float x, float y) { return __floats2half2_rn(x, y); }
};
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  __device__ __forceinline__ static __nv_bfloat162 make(float x, float y) { return __floats2bfloat162_rn(x, y); }
};

template <>
struct Pair<__nv_fp8_e4m3> {
  using type = __nv_fp8x2_e4m3;
  __device__ __forceinline__ static __nv_fp8x2_e4m3 make(float x, float y) { return __nv_fp8x2_e4m3(make_float2(x, y)); }
};
template <>
struct Pair<__nv_fp8_e5m2> {
  using type = __nv_fp8x2_e5m2;
  __device__ __forceinline__ static __nv_fp8x2_e5m2 make(float x, float y) { return __nv_fp8x2_e5m2(make_float2(x, y)); }
};

// int32 D: two accumulator registers holding int8's int32 sums as bits (see from_accumulator).
template <>
struct Pair<int32_t> {
  using type = int2;
  __device__ __forceinline__ static int2 make(float x, float y) { return make_int2(__float_as_int(x), __float_as_int(y)); }
};

// Two neighbouring 16-bit outputs as one 32-bit register (first in the low half), for the stores that
// move whole registers (st.shared.b32, stmatrix).
template <typename T>
__device__ __forceinline__ uint32_t pack(float x, float y) {
  static_assert(sizeof(T) == 2, "two 16-bit elements fill one 32-bit register");
  const typename Pair<T>::type v = Pair<T>::make(x, y);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The inverse of pack: the two 16-bit elements of a 32-bit register (ldmatrix's results) as floats.
template <typename T>
__device__ __forceinline__ float2 unpack(uint32_t bits) {
  static_assert(sizeof(T) == 2, "one 32-bit register holds two 16-bit elements");
  typename Pair<T>::type v;
  memcpy(&v, &bits, sizeof(v));
  if constexpr (std::is_same_v<T, __half>) {
    return __half22float2(v);
  } else {
    return __bfloat1622float2(v);
  }
}

}  // namespace gemmgen
