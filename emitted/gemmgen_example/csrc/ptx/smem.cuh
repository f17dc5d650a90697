// Shared-memory addresses, plain shared-memory loads and stores for the epilogues' staging buffers, and
// ldmatrix (sm80 and sm90 families).
// One small __device__ helper per instruction, each naming the PTX ISA section it follows.
#pragma once

#include <cstdint>

#include "../common/convert.cuh"

namespace gemmgen {
namespace ptx {

// Shared-memory pointer as the 32-bit address the .shared state space instructions take.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: cvta".
__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Store two fp32 values (8 bytes), one 32-bit word or one 16-bit half-word to shared memory.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: st".
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: st".
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// 16 bytes to shared memory from registers: the sm80 loader's chunks that end inside the operand, read element by
// element, and the sm90 kernel's in-place transposes. PTX ISA §9.7.10 "Data Movement and Conversion Instructions: st"
// (.shared, .v4).
__device__ __forceinline__ void st_shared_16(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: st".
__device__ __forceinline__ void st_shared_b16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}

// One 32-bit word from shared memory: the sm80 kernel's tf32 fragments of M- or N-major operands, which
// ldmatrix cannot transpose (.trans moves 16-bit elements), and the sm90 kernel's in-place transposes of them.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: ld".
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// Load two fp32 values (8 bytes) from shared memory.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: ld".
__device__ __forceinline__ float2 ld_shared_v2_f32(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// Load 16 bytes from shared memory.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: ld".
__device__ __forceinline__ uint4 ld_shared_v4_b32(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Four 8x8 b16 matrices from shared memory; lane i supplies the row address of matrix i/8, row i%8.
// PTX ISA §9.7.14.5.15 "Warp-level matrix load instruction: ldmatrix".
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same, transposed: lane t receives column t/4 of each stored 8x8 matrix (rows 2*(t%4), +1).
// PTX ISA §9.7.14.5.15 "Warp-level matrix load instruction: ldmatrix" (.trans).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two neighbouring outputs, converted to Out, as one shared-memory store (2 bytes for fp8, 4 for 16-bit types,
// 8 for fp32).
template <typename Out>
__device__ __forceinline__ void st_shared_pair(uint32_t addr, float x, float y) {
  if constexpr (sizeof(Out) == 4) {
    st_shared_v2_f32(addr, x, y);
  } else if constexpr (sizeof(Out) == 1) {
    const typename Pair<Out>::type v = Pair<Out>::make(x, y);
    st_shared_b16(addr, *reinterpret_cast<const uint16_t*>(&v));
  } else {
    st_shared_b32(addr, pack<Out>(x, y));
  }
}

}  // namespace ptx
}  // namespace gemmgen
