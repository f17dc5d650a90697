// Special registers for the sm80 and sm90 families, each read by a volatile asm statement: the compiler cannot reuse an
// earlier read or hoist one out of a loop. What is derived from tid_x_fresh and ctaid_x_fresh is then computed where it
// is needed rather than held in registers through the code between (the sm80 epilogue's coordinates through its main
// loop, the sm90 A fragments' shared-memory offsets through a persistent kernel's epilogues).
#pragma once

#include <cstdint>

namespace gemmgen {
namespace ptx {

// This thread's index in its block along x.
// PTX ISA §10.1 "Special Registers: %tid".
__device__ __forceinline__ int tid_x_fresh() {
  int r;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
  return r;
}

// This block's index in the grid along x.
// PTX ISA §10.6 "Special Registers: %ctaid".
__device__ __forceinline__ int ctaid_x_fresh() {
  int r;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(r));
  return r;
}

// The index of the SM this thread runs on (sm90/block_order.cuh records where a grid's blocks land). It may change
// only if the block is preempted, which the probe's one-instruction read does not care about.
// PTX ISA §10 "Special Registers: %smid".
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
  return sm;
}

// The GPU's nanosecond clock, the same on every SM (timing experiments: the split-K timeline).
// PTX ISA §10 "Special Registers: %globaltimer".
__device__ __forceinline__ uint64_t global_timer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

}  // namespace ptx
}  // namespace gemmgen
