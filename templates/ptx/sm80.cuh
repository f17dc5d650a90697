// PTX wrappers for the sm80 GEMM family: cp.async, mma.sync, cvt to tf32, 32-bit shared loads (ldmatrix: smem.cuh).
// One small __device__ helper per instruction, each naming the PTX ISA section it follows
// (section numbers as in the PTX ISA 8.x/9.0 manuals, titles given so they survive renumbering).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "smem.cuh"  // smem_addr, ldmatrix
#include "special_registers.cuh"  // tid_x_fresh, ctaid_x_fresh

namespace gemmgen {
namespace ptx {

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
  using Accum = float;
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
  using Accum = float;
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// D = A * B + D for one m16n8k8 tile of tf32 inputs (fp32 registers), fp32 accumulators: the k8 shape is the
// one tf32 has (4 bytes per element, so a k step is the same 32 bytes of a row as k16 of a 16-bit type).
// Fragments: PTX ISA §9.7.14.5.8 "Matrix Fragments for mma.m16n8k8" (.tf32): with g = lane / 4, t = lane % 4,
// a0 (row g, k t), a1 (row g + 8, k t), a2 (row g, k t + 4), a3 (row g + 8, k t + 4); b0 (k t, col g),
// b1 (k t + 4, col g); C/D as for m16n8k16.
// PTX ISA §9.7.14.5.14 "Multiply-and-Accumulate Instruction: mma" (shape .m16n8k8, types .tf32).
struct MmaM16N8K8Tf32 {
  using Accum = float;
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// D = A * B + D for one m16n8k32 tile of int8 inputs, int32 accumulators (exact). Its fragments in bytes are
// m16n8k16's: a0 holds row g, k 4t .. 4t + 3 (m16n8k16: k 2t, 2t + 1), and so on, so the same ldmatrix
// addresses of K-major operands feed it. PTX ISA §9.7.14.5.14 "Multiply-and-Accumulate Instruction: mma"
// (shape .m16n8k32, types .s8, .s32); fragments §9.7.14.5.9 "Matrix Fragments for mma.m16n8k32".
struct MmaM16N8K32S8 {
  using Accum = int32_t;
  __device__ __forceinline__ static void run(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// fp32 bits -> tf32 bits, rounded to nearest (mma.sync would otherwise drop the 13 low mantissa bits:
// truncation), as cuBLAS rounds its tf32 inputs. sm_90 has round-to-nearest-even in one instruction
// (F2FP.TF32.F32.PACK_B); sm_80 has only ties-away (.rna), three instructions (a finiteness test, a predicated
// add of half a tf32 ulp, a mask). The two differ only on exact ties. Inf and NaN pass unchanged.
// PTX ISA §9.7.9.21 "Data Movement and Conversion Instructions: cvt" (cvt.rn.tf32.f32: sm_90 and newer;
// cvt.rna.tf32.f32: sm_80 and newer).
__device__ __forceinline__ uint32_t cvt_tf32(uint32_t bits) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("cvt.rn.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(bits)));
#else
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(bits)));
#endif
  return r;
}

// 16 bytes of global memory read once and never again by this SM (a weight streamed by the small-M kernel):
// through the non-coherent path, not kept in L1, the L2 asked to fetch the whole 256-byte sector group. Not
// volatile (nor the next): a read of inputs no kernel writes, which the compiler may hoist and batch.
// PTX ISA §9.7.9.8 "Data Movement and Conversion Instructions: ld" (.global.nc, .L1::no_allocate,
// .L2::256B, .v4; sm_80 and newer for the L2 prefetch size).
__device__ __forceinline__ uint4 ld_global_stream_16(const void* addr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(addr));
  return v;
}

// The transpose of an 8 x 8 matrix of 16-bit values held by the warp: lane l holds row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 in `a`, and gets the same positions of the transpose (column l / 4 of the input,
// rows 2 (l % 4) and 2 (l % 4) + 1). sm_75 and newer. PTX ISA §9.7.14.5.16 "Warp-level Matrix Transpose
// Instruction: movmatrix".
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

// 16 bytes of global memory that other warps of this SM read too (the small-M kernel's rows of A): through
// the non-coherent path and kept in L1. PTX ISA §9.7.9.8 "Data Movement and Conversion Instructions: ld".
__device__ __forceinline__ uint4 ld_global_shared_16(const void* addr) {
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(addr));
  return v;
}

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
