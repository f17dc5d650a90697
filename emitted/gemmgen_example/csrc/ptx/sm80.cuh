// PTX wrappers for the sm80 GEMM family: cp.async, mma.sync (ldmatrix: smem.cuh).
// One small __device__ helper per instruction, each naming the PTX ISA section it follows
// (section numbers as in the PTX ISA 8.x/9.0 manuals, titles given so they survive renumbering).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "smem.cuh"  // smem_addr, ldmatrix

namespace gemmgen {
namespace ptx {

// This thread's index in its block, read anew at each call: the asm is volatile so the compiler
// cannot reuse an earlier read. A value needed only after the main loop (the epilogue's coordinates)
// is then derived again there rather than held in a register through it.
// PTX ISA §10.1 "Special Registers: %tid".
__device__ __forceinline__ int tid_x_fresh() {
  int r;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
  return r;
}

// This block's index in the grid, read anew at each call (as tid_x_fresh).
// PTX ISA §10.6 "Special Registers: %ctaid".
__device__ __forceinline__ int ctaid_x_fresh() {
  int r;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(r));
  return r;
}

// 16-byte global -> shared copy that bypasses L1 (.cg), zero-filling the bytes past `src_bytes`.
// src_bytes = 0 copies nothing and writes 16 zero bytes: this is how ragged edges are predicated.
// PTX ISA §9.7.9.25.3.1 "Data Movement and Conversion Instructions: cp.async".
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Close the group of cp.async issued so far by this thread.
// PTX ISA §9.7.9.25.3.2 "Data Movement and Conversion Instructions: cp.async.commit_group".
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most N of this thread's committed groups are still in flight.
// PTX ISA §9.7.9.25.3.3 "Data Movement and Conversion Instructions: cp.async.wait_group".
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// D = A * B + D for one m16n8k16 tile, A row fragment, B column fragment, fp32 accumulators.
// PTX ISA §9.7.14.5.14 "Multiply-and-Accumulate Instruction: mma" (shape .m16n8k16).
template <typename T>
struct MmaM16N8K16;

template <>
struct MmaM16N8K16<__half> {
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <>
struct MmaM16N8K16<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// PTX ISA §9.7.3.22 "Floating Point Instructions: tanh" (tanh.approx.f32, sm_75 and newer): maximum
// relative error 2^-10.987, one MUFU operation.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// PTX ISA §9.7.9.15 "Data Movement and Conversion Instructions: prefetch" (prefetch.global.L2): bring the
// 128-byte line holding `addr` into L2, without waiting and without a register.
__device__ __forceinline__ void prefetch_l2(const void* addr) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(addr));
}

}  // namespace ptx
}  // namespace gemmgen
