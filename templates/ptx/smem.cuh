// Shared-memory addresses, and plain shared-memory loads and stores for the epilogues' staging buffers
// (sm80 and sm90 families).
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

// Store two fp32 values (8 bytes) or one 32-bit word to shared memory.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: st".
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: st".
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
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

// Two neighbouring outputs, converted to Out, as one shared-memory store (4 bytes for 16-bit types,
// 8 for fp32).
template <typename Out>
__device__ __forceinline__ void st_shared_pair(uint32_t addr, float x, float y) {
  if constexpr (sizeof(Out) == 4) {
    st_shared_v2_f32(addr, x, y);
  } else {
    st_shared_b32(addr, pack<Out>(x, y));
  }
}

}  // namespace ptx
}  // namespace gemmgen
