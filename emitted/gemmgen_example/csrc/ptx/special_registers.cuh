// Special registers read anew at each call (sm80 and sm90 families): the asm is volatile, so the compiler cannot reuse
// an earlier read or hoist one out of a loop. What is derived from them is then computed where it is needed rather
// than held in registers through the code between (the sm80 epilogue's coordinates through its main loop, the sm90
// A fragments' shared-memory offsets through a persistent kernel's epilogues).
#pragma once

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

}  // namespace ptx
}  // namespace gemmgen
