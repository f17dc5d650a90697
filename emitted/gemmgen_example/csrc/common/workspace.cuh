// Stream-ordered workspaces of a kernel library: its own memory pool, and the aligned copies of operands whose
// rows break the fast kernels' 16-byte rule (repacking). Host code and one copy kernel; no torch.
#pragma once

#include <cstdint>
#include <mutex>
#include <cuda_runtime.h>

#include "alignment.cuh"
#include "gemm_args.h"

namespace gemmgen {

constexpr int kMaxDevices = 64;

// The memory pool of this library's stream-ordered workspaces on `device` (stream-K's partial sums, repacked
// operands): one of the library's own, which keeps up to
// kWorkspacePoolKeepBytes between launches instead of handing memory back to the driver at every
// synchronization (the default pool's behaviour), and leaves the process's default pool alone.
constexpr uint64_t kWorkspacePoolKeepBytes = uint64_t(256) << 20;
inline cudaError_t workspace_pool(int device, cudaMemPool_t* pool) {
  static std::mutex mutex;
  static cudaMemPool_t pools[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  const std::lock_guard<std::mutex> lock(mutex);
  if (pools[device] == nullptr) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t created = nullptr;
    cudaError_t err = cudaMemPoolCreate(&created, &props);
    if (err != cudaSuccess) return err;
    uint64_t keep = kWorkspacePoolKeepBytes;
    err = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep);
    if (err != cudaSuccess) return err;
    pools[device] = created;
  }
  *pool = pools[device];
  return cudaSuccess;
}

// Below this M x N x K the unaligned kernel beats copying (a copy launch, a workspace from the pool and the fast
// kernel cost a few microseconds more than its whole run: 256^3 takes ~2 us on it); above, repacking wins by far.
constexpr int64_t kRepackMinVolume = int64_t(1) << 26;

// Row pitches of repacked copies are multiples of this many bytes (the fast kernels' chunks).
constexpr int64_t kRepackAlignBytes = 16;

// Internal linkage from here on: each kernel library (translation unit) has its own copy kernel and launch code,
// so that the libraries linked into one package never share (and never register twice) a kernel.
namespace {

// dst (lines x cols, pitch ld_dst elements) = src (the same, pitch ld_src): element by element, consecutive threads
// on consecutive elements of a line, the grid striding over lines.
template <typename T>
__global__ void repack_lines(const T* __restrict__ src, int64_t ld_src, T* __restrict__ dst, int64_t ld_dst,
                             int64_t lines, int64_t cols) {
  for (int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
    const T* from = src + line * ld_src;
    T* to = dst + line * ld_dst;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) to[c] = from[c];
  }
}

// One operand's copy: `lines` rows (K-major storage) or columns (the other) of `cols` contiguous elements each.
struct RepackPlan {
  bool needed = false;
  int64_t lines = 0, cols = 0, ld = 0;   // ld: the copy's pitch, rounded up to kRepackAlignBytes
  size_t bytes = 0;                      // rounded up to 256 so that the next copy starts aligned too
};

inline RepackPlan plan_repack(bool needed, bool k_major, int64_t outer, int64_t k, int64_t elem_bytes) {
  RepackPlan plan;
  if (!needed) return plan;
  const int64_t per_chunk = kRepackAlignBytes / elem_bytes;
  plan.needed = true;
  plan.lines = k_major ? outer : k;
  plan.cols = k_major ? k : outer;
  plan.ld = (plan.cols + per_chunk - 1) / per_chunk * per_chunk;
  plan.bytes = static_cast<size_t>((plan.lines * plan.ld * elem_bytes + 255) / 256 * 256);
  return plan;
}

template <typename T>
inline void launch_repack(const RepackPlan& plan, const void* src, int64_t ld_src, void* dst, cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 8192;   // grid-stride beyond: each block copies several lines
  const unsigned blocks = static_cast<unsigned>(plan.lines < kMaxBlocks ? plan.lines : kMaxBlocks);
  repack_lines<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(src), ld_src, static_cast<T*>(dst),
                                                    plan.ld, plan.lines, plan.cols);
}

// The call with A and/or B (whichever breaks the 16-byte rule) copied into one workspace of the library's pool with
// 16-byte-aligned pitches, run by `relaunch` (the fast or small-M path), the workspace freed in the stream after it.
// Workspace: each copied operand's lines x its padded pitch, never more than its own bytes plus 15 per line.
template <class Cfg, class Relaunch>
inline int launch_repacked(const GemmArgs* args, cudaStream_t stream, Relaunch&& relaunch) {
  using ElemA = typename Cfg::Elem;
  using ElemB = typename Cfg::ElemB;
  const RepackPlan plan_a = plan_repack(!fast_aligned(args->a, args->lda, sizeof(ElemA)), Cfg::kAKMajor, args->m,
                                        args->k, sizeof(ElemA));
  const RepackPlan plan_b = plan_repack(!fast_aligned(args->b, args->ldb, sizeof(ElemB)), Cfg::kBKMajor, args->n,
                                        args->k, sizeof(ElemB));
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  cudaMemPool_t pool = nullptr;
  if (err == cudaSuccess) err = workspace_pool(device, &pool);
  char* workspace = nullptr;
  if (err == cudaSuccess) {
    err = cudaMallocFromPoolAsync(reinterpret_cast<void**>(&workspace), plan_a.bytes + plan_b.bytes, pool, stream);
  }
  if (err != cudaSuccess) return static_cast<int>(err);
  GemmArgs packed = *args;
  if (plan_a.needed) {
    launch_repack<ElemA>(plan_a, args->a, args->lda, workspace, stream);
    packed.a = workspace;
    packed.lda = plan_a.ld;
  }
  if (plan_b.needed) {
    launch_repack<ElemB>(plan_b, args->b, args->ldb, workspace + plan_a.bytes, stream);
    packed.b = workspace + plan_a.bytes;
    packed.ldb = plan_b.ld;
  }
  err = cudaGetLastError();
  int code = err == cudaSuccess ? relaunch(&packed) : static_cast<int>(err);
  const cudaError_t freed = cudaFreeAsync(workspace, stream);
  if (code == 0 && freed != cudaSuccess) code = static_cast<int>(freed);
  return code;
}

}  // namespace
}  // namespace gemmgen
