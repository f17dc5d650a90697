// Stream-ordered workspaces of a kernel library: its own memory pool, and the aligned copies of operands whose
// rows break the fast kernels' 16-byte rule (repacking). Host code and the copy kernel's body; no torch.
#pragma once

#include <climits>
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

// `bytes` of stream-ordered workspace on `device` from the library's pool, for work queued on `stream` (freed there
// with cudaFreeAsync once that work is queued).
inline cudaError_t workspace_alloc(int device, size_t bytes, cudaStream_t stream, void** workspace) {
  cudaMemPool_t pool = nullptr;
  const cudaError_t err = workspace_pool(device, &pool);
  return err == cudaSuccess ? cudaMallocFromPoolAsync(workspace, bytes, pool, stream) : err;
}

// Stream-K's flags (sm90::LaunchWorkspace) kept per stream between launches, so that no launch queues a memset to
// zero them: each launch on a stream takes the next epoch of that stream's flags, a value no flag holds yet (they
// only hold epochs of earlier launches on the same stream, which ran before it). Zeroed once when allocated and again
// when the epochs would wrap. Streams are told apart by cudaStreamGetId, unique for the process's life, so a new
// stream never inherits flags that a destroyed one's last launch may still write; the flags of a destroyed stream
// (a few KB) stay allocated. A CUDA graph may replay on any stream, so a capture does not use them
// (sm90::stream_k_workspace zeroes flags of its own there). The registry is sm90::stream_k_flags (stream-K is the
// sm90 family's; cudaStreamGetId needs CUDA 12, which sm_90a needs too).
// Flags enough for the largest persistent grids (132 SMs x 2 consumer warpgroups), so that they are rarely replaced.
constexpr size_t kStreamKMinFlags = 1024;

struct StreamKFlags {
  int* flags = nullptr;
  size_t slots = 0;
  int epoch = 0;  // the last one taken; INT_MAX: zero the flags before the next launch takes one

  // How many flags a launch that needs `needed` must replace these with first (0: it keeps them).
  size_t replacement(size_t needed) const {
    if (slots >= needed) return 0;
    return needed > kStreamKMinFlags ? needed : kStreamKMinFlags;
  }
  // Whether they must be zeroed before that launch takes its epoch: new flags, or the epochs about to wrap.
  bool needs_zeroing(size_t needed) const { return slots < needed || epoch == INT_MAX; }
};

// Below this M x N x K the unaligned kernel beats copying (a copy launch, a workspace from the pool and the fast
// kernel cost a few microseconds more than its whole run: 256^3 takes ~2 us on it); above, repacking wins by far.
constexpr int64_t kRepackMinVolume = int64_t(1) << 26;

// Row pitches of repacked copies are multiples of this many bytes (the fast kernels' chunks).
constexpr int64_t kRepackAlignBytes = 16;

// One copy of the repacking: `lines` lines of `cols` elements of `elem_bytes` (1, 2 or 4), from a pitch of ld_src
// elements to one of ld_dst. Each library has a named kernel that runs it (<name>_repack, rendered beside the
// unaligned one), so profiles and ptxas reports name it.
struct RepackArgs {
  const void* src;
  void* dst;
  int64_t ld_src, ld_dst, lines, cols;
  int elem_bytes;
};

constexpr int kRepackThreads = 256;
constexpr int64_t kRepackMaxBlocks = 8192;   // grid-stride beyond: each block copies several lines

template <typename T>
__device__ __forceinline__ void copy_lines(const RepackArgs& args) {
  const T* __restrict__ src = static_cast<const T*>(args.src);
  T* __restrict__ dst = static_cast<T*>(args.dst);
  for (int64_t line = blockIdx.x; line < args.lines; line += gridDim.x) {
    const T* from = src + line * args.ld_src;
    T* to = dst + line * args.ld_dst;
    for (int64_t c = threadIdx.x; c < args.cols; c += blockDim.x) to[c] = from[c];
  }
}

// The copy kernel's body: element by element, consecutive threads on consecutive elements of a line, the grid
// striding over lines.
__device__ __forceinline__ void repack_lines(const RepackArgs& args) {
  if (args.elem_bytes == 1) {
    copy_lines<uint8_t>(args);
  } else if (args.elem_bytes == 2) {
    copy_lines<uint16_t>(args);
  } else {
    copy_lines<uint32_t>(args);
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

inline void launch_repack(void (*repack)(RepackArgs), const RepackPlan& plan, const void* src, int64_t ld_src,
                          void* dst, int elem_bytes, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(plan.lines < kRepackMaxBlocks ? plan.lines : kRepackMaxBlocks);
  repack<<<blocks, kRepackThreads, 0, stream>>>(RepackArgs{src, dst, ld_src, plan.ld, plan.lines, plan.cols,
                                                           elem_bytes});
}

// The call with A and/or B (whichever breaks the 16-byte rule) copied into one workspace of the library's pool with
// 16-byte-aligned pitches by the library's `repack` kernel, run by `relaunch` (the fast or small-M path), the
// workspace freed in the stream after it. Workspace: each copied operand's lines x its padded pitch, never more than
// its own bytes plus 15 per line.
template <class Cfg, class Relaunch>
inline int launch_repacked(void (*repack)(RepackArgs), const GemmArgs* args, cudaStream_t stream,
                           Relaunch&& relaunch) {
  using ElemA = typename Cfg::Elem;
  using ElemB = typename Cfg::ElemB;
  const RepackPlan plan_a = plan_repack(!fast_aligned(args->a, args->lda, sizeof(ElemA)), Cfg::kAKMajor, args->m,
                                        args->k, sizeof(ElemA));
  const RepackPlan plan_b = plan_repack(!fast_aligned(args->b, args->ldb, sizeof(ElemB)), Cfg::kBKMajor, args->n,
                                        args->k, sizeof(ElemB));
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  char* workspace = nullptr;
  if (err == cudaSuccess) {
    err = workspace_alloc(device, plan_a.bytes + plan_b.bytes, stream, reinterpret_cast<void**>(&workspace));
  }
  if (err != cudaSuccess) return static_cast<int>(err);
  GemmArgs packed = *args;
  if (plan_a.needed) {
    launch_repack(repack, plan_a, args->a, args->lda, workspace, sizeof(ElemA), stream);
    packed.a = workspace;
    packed.lda = plan_a.ld;
  }
  if (plan_b.needed) {
    launch_repack(repack, plan_b, args->b, args->ldb, workspace + plan_a.bytes, sizeof(ElemB), stream);
    packed.b = workspace + plan_a.bytes;
    packed.ldb = plan_b.ld;
  }
  err = cudaGetLastError();
  int code = err == cudaSuccess ? relaunch(&packed) : static_cast<int>(err);
  const cudaError_t freed = cudaFreeAsync(workspace, stream);
  if (code == 0 && freed != cudaSuccess) code = static_cast<int>(freed);
  return code;
}

}  // namespace gemmgen
