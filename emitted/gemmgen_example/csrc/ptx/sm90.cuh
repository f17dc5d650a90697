// PTX wrappers for the sm90 GEMM family: mbarrier, TMA (cp.async.bulk.tensor), thread-block
// clusters, wgmma synchronization and matrix descriptors, setmaxnreg, proxy fences.
// One small __device__ helper per instruction, each naming the PTX ISA section it follows: the
// chapter number of the PTX ISA 9.0 manual (deeper numbers move between releases) and the exact
// section title.
// Everything here needs sm_90a (wgmma, setmaxnreg) or sm_90 (the rest).
#pragma once

#include <cstdint>

#include "smem.cuh"  // smem_addr, the epilogue's staging stores
#include "special_registers.cuh"  // tid_x_fresh, sm_id, global_timer
#include "sm90_wgmma.cuh"

namespace gemmgen {
namespace ptx {

// ---- mbarrier ---------------------------------------------------------------------------------

// Initialize a barrier that completes a phase after `count` arrivals (and all expected tx bytes).
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: mbarrier.init".
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Make barrier initializations visible to the async proxy (TMA) and to the other CTAs of the cluster.
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: membar/fence"
// (fence.mbarrier_init).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrive once and add `bytes` to the transaction count the current phase waits for (the producer,
// before issuing the TMA loads that will complete those bytes).
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: mbarrier.arrive"
// (.expect_tx).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Arrive once on a barrier of this CTA.
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: mbarrier.arrive".
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Arrive once on the barrier at the same shared-memory offset in CTA `cta` of this cluster. Default
// semantics (release at CTA scope), as for a local arrive: the slot's readers are wgmma operations that
// wgmma.wait_group has already seen complete.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: mapa" and "Parallel Synchronization and
// Communication Instructions: mbarrier.arrive" (.shared::cluster).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}

// Non-blocking test whether the phase with parity `parity` has completed.
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: mbarrier.test_wait/try_wait"
// (try_wait.parity; the instruction itself may suspend the thread for a system-defined time).
__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Block until the phase with parity `parity` has completed. A fresh barrier is in phase 0, so waiting
// for parity 1 (the phase "before" it) returns at once: that is how a producer starts on empty slots.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

// ---- TMA (the tensor memory accelerator) ---------------------------------------------------------

// Hint the TMA unit to fetch a tensor map (a __grid_constant__ kernel parameter) ahead of first use.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: prefetch" (prefetch.tensormap).
__device__ __forceinline__ void prefetch_tensormap(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// Acquire the 128-byte tensor map at `tmap` (global memory) for the tensormap proxy: its contents, written before the
// kernel by the host (a copy into device memory), are then what this thread's TMA operations through it read. The
// system scope: the writer was the host.
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: membar/fence"
// (fence.proxy.tensormap::generic.acquire).
__device__ __forceinline__ void fence_proxy_tensormap_acquire(const void* tmap) {
  asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(tmap))
               : "memory");
}

// In the tensor map at `tmap` (shared memory, 128-byte aligned): the extent of dimension ORD (0: innermost), in
// elements. Only sm_90a has it.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: tensormap.replace" (.global_dim).
template <int ORD>
__device__ __forceinline__ void tensormap_replace_global_dim(uint32_t tmap, int extent) {
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], %1, %2;\n" ::"r"(tmap), "n"(ORD),
               "r"(extent)
               : "memory");
}

// In the tensor map at `tmap` (shared memory, 128-byte aligned): the stride of dimension ORD + 1 (ORD 0: between the
// rows of dimension 1), in bytes, a multiple of 16. Only sm_90a has it.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: tensormap.replace" (.global_stride).
template <int ORD>
__device__ __forceinline__ void tensormap_replace_global_stride(uint32_t tmap, int64_t bytes) {
  asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], %1, %2;\n" ::"r"(tmap), "n"(ORD),
               "l"(bytes)
               : "memory");
}

// In the tensor map at `tmap` (shared memory, 128-byte aligned): the global base address (16-byte aligned).
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: tensormap.replace" (.global_address).
__device__ __forceinline__ void tensormap_replace_global_address(uint32_t tmap, const void* address) {
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n" ::"r"(tmap),
               "l"(reinterpret_cast<uint64_t>(address))
               : "memory");
}

// The 128-byte tensor map at `from` (shared memory) copied to `to` (global memory) and released to the tensormap
// proxy at GPU scope, so that a later kernel's TMA operations through `to` (after their acquire) read it. The whole
// warp executes it (.sync.aligned).
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: tensormap.cp_fenceproxy".
__device__ __forceinline__ void tensormap_copy_release(void* to, uint32_t from) {
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;\n" ::"l"(
          reinterpret_cast<uint64_t>(to)),
      "r"(from)
      : "memory");
}

// A tile of a 3-D tensor (a batch of matrices: c2 the matrix) global -> shared of this CTA, completing `bytes` on
// barrier `bar`. Coordinates are in elements, innermost first; parts of the box outside the tensor are filled
// with zeros.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: cp.async.bulk.tensor" (.3d).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tmap, uint32_t bar, int32_t c0, int32_t c1,
                                            int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(tmap)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The same tile written to the same shared-memory offset of every CTA in `cta_mask` (bit i: cluster
// rank i), each completing the bytes on its own barrier at offset `bar`.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: cp.async.bulk.tensor" (.multicast::cluster).
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const void* tmap, uint32_t bar, int32_t c0,
                                                      int32_t c1, int32_t c2, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}

// A 3-D tile shared -> global; the parts of the box outside the tensor are not written.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: cp.async.bulk.tensor" (.global.shared::cta).
__device__ __forceinline__ void tma_store_3d(const void* tmap, uint32_t src, int32_t c0, int32_t c1, int32_t c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

// Close the group of bulk stores issued so far by this thread.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: cp.async.bulk.commit_group".
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Wait until at most N bulk store groups still read their shared-memory source.
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: cp.async.bulk.wait_group" (.read).
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Wait until at most N bulk store groups are incomplete (their writes performed).
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: cp.async.bulk.wait_group".
template <int N>
__device__ __forceinline__ void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Order this thread's generic-proxy shared-memory writes before later async-proxy (TMA) reads.
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: membar/fence" (fence.proxy.async).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- clusters -----------------------------------------------------------------------------------

// This CTA's rank in its cluster.
// PTX ISA §10 "Special Registers: %cluster_ctarank".
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// All threads of all CTAs in the cluster meet here; release/acquire orders memory around it.
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: barrier.cluster".
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// ---- named barriers -------------------------------------------------------------------------------

// Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads (a multiple of 32).
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: bar/barrier" (bar.sync).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrive at barrier `id` without waiting: the other side of a producer/consumer hand-over.
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: bar/barrier" (bar.arrive).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- hand-over between CTAs through global memory (stream-K partial sums) -------------------------

// Publish `value` at `flag` after every write this thread made, or observed, before it (release at
// GPU scope: another CTA that acquires the value sees those writes).
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: st" (st.release.gpu).
__device__ __forceinline__ void st_release_gpu(int* flag, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
}

// Read `flag`; writes published before the value it returns are visible after it (acquire, GPU scope).
// PTX ISA §9.7.10 "Data Movement and Conversion Instructions: ld" (ld.acquire.gpu).
__device__ __forceinline__ int ld_acquire_gpu(const int* flag) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

// ---- warp-level matrix store (the epilogue's staging of 16-bit outputs) ------------------------------

// Four 8x8 matrices of 16-bit elements from registers to shared memory, one 16-byte row per address: lane l
// gives the address of row l % 8 of matrix l / 8, and register q of every lane holds two neighbouring
// elements of matrix q (row lane / 4, columns 2 * (lane % 4) and + 1) -- the accumulator fragment layout
// of mma/wgmma, so a warp stores 512 bytes of its tile with one instruction instead of 16 4-byte stores.
// PTX ISA §9.7.14 "Warp Level Matrix Multiply-Accumulate Instructions: stmatrix" (sm_90).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// The same four matrices, each stored transposed: the address of lane l now starts column l % 8 of matrix l / 8
// (16 bytes: the column's eight elements, row 0 first). A column-major D is staged so, as D's transpose in rows.
// PTX ISA §9.7.14 "Warp Level Matrix Multiply-Accumulate Instructions: stmatrix" (.trans, sm_90).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                                  uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- warpgroups: wgmma ordering and register reallocation ----------------------------------------

// Order this warpgroup's register and shared-memory accesses before the wgmma.mma_async that follow.
// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Instructions: wgmma.fence".
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Close the group of wgmma.mma_async issued so far by this warpgroup.
// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Instructions: wgmma.commit_group".
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Wait until at most N wgmma groups of this warpgroup are pending.
// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Instructions: wgmma.wait_group".
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keep the compiler from moving accumulator reads/writes across wgmma fences and waits: the
// accumulators are written asynchronously, which the compiler cannot see. No instruction: it keeps
// the register accesses where PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Instructions:
// wgmma.fence" requires them (between the fence and the wait).
__device__ __forceinline__ void fence_operand(float& reg) { asm volatile("" : "+f"(reg)::"memory"); }
__device__ __forceinline__ void fence_operand(int32_t& reg) { asm volatile("" : "+r"(reg)::"memory"); }
// The same for A's fragments in registers, which a wgmma reads until its group completes (§9.7.15.5.1.1).
__device__ __forceinline__ void fence_operand(uint32_t& reg) { asm volatile("" : "+r"(reg)::"memory"); }

// Make a value opaque to the compiler (an empty asm: no instruction), so that it keeps it in a register
// instead of deriving it again where it is used: the main loop's bases of the matrix descriptors of
// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Shared Memory Layout: Matrix Descriptor Format",
// which it otherwise recomputed from the shared-memory window's base in every k tile.
__device__ __forceinline__ void keep_in_register(uint64_t& value) { asm volatile("" : "+l"(value)); }
__device__ __forceinline__ void keep_in_register(uint32_t& value) { asm volatile("" : "+r"(value)); }

// Grow (INC) or shrink this warpgroup's per-thread register budget to REGS.
// PTX ISA §9.7.19 "Miscellaneous Instructions: setmaxnreg".
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
// PTX ISA §9.7.19 "Miscellaneous Instructions: setmaxnreg" (.dec).
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// ---- shared-memory matrix descriptors --------------------------------------------------------------

// The 64-bit descriptor wgmma reads a shared-memory operand through, for the 128-byte swizzle mode:
//   bits  0-13  start address >> 4
//   bits 16-29  leading-dimension byte offset >> 4
//   bits 32-45  stride-dimension byte offset >> 4
//   bits 62-63  swizzle mode (1 = 128-byte swizzle)
// K-major operand: rows of 64 16-bit elements (128 bytes), 8-row groups 1024 bytes apart (stride
// offset); the leading offset is unused. M/N-major: 64 M/N-elements per 128-byte row, one row per k,
// 8-k groups `stride` bytes apart, 64-element M/N chunks `leading` bytes apart.
// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Shared Memory Layout: Matrix Descriptor Format".
constexpr uint64_t kDescSwizzle128 = 1ull << 62;
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return kDescSwizzle128 | (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32) |
         (static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16) | static_cast<uint64_t>((addr >> 4) & 0x3FFF);
}

// The same descriptor for an operand `units` x 16 bytes further on: only the start-address field (the low
// 14 bits, address >> 4) changes, and a CTA's shared-memory addresses stay below 2^18 bytes (it has at most
// 228 KB), so the sum never carries out of the field and a 32-bit add on the low word suffices.
// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Shared Memory Layout: Matrix Descriptor Format".
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t units) {
  const uint32_t lo = static_cast<uint32_t>(desc) + units;
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// ---- programmatic dependent launch -----------------------------------------------------------

// Block until the grids this one depends on programmatically (the stream's previous kernel, when this one was
// launched with cudaLaunchAttributeProgrammaticStreamSerialization) have completed and their writes are visible.
// Returns at once in a grid launched without that attribute. Every global read or write of a kernel that may be
// launched early comes after it.
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: griddepcontrol" (.wait).
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Let the stream's next kernel, if it was launched with programmatic stream serialization, be scheduled once every
// block of this grid has called this or exited. It says nothing about this grid's writes: the dependent's
// grid_dependency_wait still waits for this grid to complete. The first call of a block counts; later ones are no-ops.
// PTX ISA §9.7.13 "Parallel Synchronization and Communication Instructions: griddepcontrol" (.launch_dependents).
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

}  // namespace ptx
}  // namespace gemmgen
