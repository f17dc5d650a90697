// Host side of a generated kernel library: pick the kernel an operand set allows, size the grid,
// raise the shared-memory limit once per device, launch on the caller's stream.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#include "alignment.cuh"
#include "batch.cuh"
#include "gemm_args.h"
#include "gemm_small_m.cuh"
#include "gemm_unaligned.cuh"
#include "workspace.cuh"

namespace gemmgen {

// A launch code (a cudaError_t value) as the op's error message says it: "CUDA error 2 (out of memory)".
inline const char* cuda_error_text(int code) {
  thread_local char text[160];
  std::snprintf(text, sizeof text, "CUDA error %d (%s)", code, cudaGetErrorString(static_cast<cudaError_t>(code)));
  return text;
}

// The current device's SM count (the small-M kernel's bound on an N-major B's strips), cached per device: atomic, as
// raise_smem_limit's flags (threads on several GPUs launch at once). 0 where the query fails.
inline int current_sm_count() {
  static std::atomic<int> known[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return 0;
  const int cached = device < kMaxDevices ? known[device].load(std::memory_order_relaxed) : 0;
  if (cached > 0) return cached;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  if (device < kMaxDevices) known[device].store(sms, std::memory_order_relaxed);
  return sms;
}

// Whether an aligned call takes the small-M kernel: a K-major B at any size, an N-major one within its bounds
// (small_m::n_major_fits; the SM count asked for only then).
template <class Cfg>
inline bool takes_small_m(const GemmArgs& args) {
  if (!small_m::kAvailable<Cfg> || args.m > small_m::kMaxRows) return false;
  return Cfg::kBKMajor || small_m::n_major_fits<Cfg>(args, current_sm_count());
}

// The fast kernels copy 16-byte chunks (sm80: cp.async; sm90: TMA, whose tensor maps take only
// 16-byte-aligned base addresses and strides): each operand's base address, leading dimension and (in a batch)
// batch stride must keep every chunk 16-byte aligned. Anything else is copied into an aligned workspace first
// (repacked) when the problem is big enough to repay the copy (single problems only), else it takes the unaligned
// kernel. Aligned calls with at most small_m::kMaxRows rows take the small-M kernel where the config has one (its
// 16-byte loads follow the same rule). `args` as the launch sees them: after fold_batch.
template <class Cfg>
inline GemmPath choose_folded_path(const GemmArgs& args) {
  // A quantized (fp8) D with K = 0: the fast kernel's epilogue of zero, whatever A and B (nothing is loaded).
  if constexpr (kIsFp8<typename Cfg::Out>) {
    if (args.k == 0) return batch_count(args) == 1 ? GEMM_PATH_FAST : GEMM_PATH_NONE;
  }
  if (!batch_aligned(args, args.a, args.lda, args.batch_stride_a, sizeof(typename Cfg::Elem)) ||
      !batch_aligned(args, args.b, args.ldb, args.batch_stride_b, sizeof(typename Cfg::ElemB))) {
    const bool single = batch_count(args) == 1;
    // A quantized (fp8) D only from the fast kernels, whose epilogue scales it: repacked whatever the size.
    if constexpr (kIsFp8<typename Cfg::Out>) return single ? GEMM_PATH_REPACKED : GEMM_PATH_NONE;
    const bool repays = single && args.m * args.n * args.k >= kRepackMinVolume;
    return repays ? GEMM_PATH_REPACKED : GEMM_PATH_UNALIGNED;
  }
  return takes_small_m<Cfg>(args) ? GEMM_PATH_SMALL_M : GEMM_PATH_FAST;
}

// Grouped calls: only the sm90 family's persistent kernels walk groups (GROUPED), on operands that keep the
// 16-byte rule; every other library and operand set has no kernel for them (NONE).
template <class Cfg>
inline GemmPath choose_grouped_path(const GemmArgs& args) {
  const bool aligned = batch_aligned(args, args.a, args.lda, 0, sizeof(typename Cfg::Elem)) &&
                       batch_aligned(args, args.b, args.ldb, args.batch_stride_b, sizeof(typename Cfg::ElemB));
  return Cfg::kWalksGroups && aligned ? GEMM_PATH_GROUPED : GEMM_PATH_NONE;
}

// A list of problems: the sm90 family's persistent kernels with the identity epilogue (Cfg::kWalksLists), every
// problem's A and B on the 16-byte rule (each has its own tensor maps; D takes direct stores where its own breaks
// it). A listed problem with no rows or columns has nothing to load, whatever its operands.
template <class Cfg>
inline GemmPath choose_list_path(const GemmArgs& args) {
  if (!Cfg::kWalksLists || batch_invalid(args)) return GEMM_PATH_NONE;
  for (int64_t i = 0; i < args.batch; ++i) {
    const GemmListProblem& q = args.list[i];
    if (q.m <= 0 || q.n <= 0 || q.k <= 0) continue;
    if (!fast_aligned(q.a, q.lda, sizeof(typename Cfg::Elem)) || !fast_aligned(q.b, q.ldb, sizeof(typename Cfg::ElemB)))
      return GEMM_PATH_NONE;
  }
  return GEMM_PATH_GROUPED;
}

// Groups along K: the kernels that walk lists (each group is a listed problem whose maps the launch builds on the
// device) with K the outer dimension of A and B (a group starts at any k, which a TMA load cannot start at along an
// operand's contiguous dimension), A and B on the 16-byte rule (one matrix each); D takes direct stores where it
// breaks it.
template <class Cfg>
inline GemmPath choose_k_grouped_path(const GemmArgs& args) {
  const bool aligned = fast_aligned(args.a, args.lda, sizeof(typename Cfg::Elem)) &&
                       fast_aligned(args.b, args.ldb, sizeof(typename Cfg::ElemB));
  const bool k_outer = !Cfg::kAKMajor && !Cfg::kBKMajor;
  return Cfg::kWalksLists && k_outer && !batch_invalid(args) && aligned ? GEMM_PATH_GROUPED : GEMM_PATH_NONE;
}

template <class Cfg>
inline GemmPath choose_path(const GemmArgs& args) {
  if (is_list(args)) return choose_list_path<Cfg>(args);
  if (is_k_grouped(args)) return choose_k_grouped_path<Cfg>(args);
  if (is_grouped(args)) return choose_grouped_path<Cfg>(args);
  return choose_folded_path<Cfg>(fold_batch<Cfg>(args));
}

// Runs launch_chunk(chunk, problems) for each run of at most kMaxBatchPerLaunch problems of a batch (one run for a
// single problem): the grid's y extent, which the pointer-addressed kernels take their problem from.
template <class Cfg, class LaunchChunk>
inline int for_each_batch_chunk(const GemmArgs& args, LaunchChunk&& launch_chunk) {
  const int64_t batch = batch_count(args);
  for (int64_t first = 0; first < batch; first += kMaxBatchPerLaunch) {
    GemmArgs chunk = problem_args<Cfg>(args, first);
    chunk.batch = batch - first < kMaxBatchPerLaunch ? batch - first : kMaxBatchPerLaunch;
    const int code = launch_chunk(chunk, static_cast<unsigned>(chunk.batch));
    if (code != 0) return code;
  }
  return 0;
}

// The always-correct kernel of common/gemm_unaligned.cuh, for operands the fast kernel cannot take.
template <class Cfg>
inline int launch_unaligned(void (*slow)(GemmArgs), const GemmArgs* args, cudaStream_t stream) {
  const int64_t tiles = ((args->m + unaligned::kTile - 1) / unaligned::kTile) *
                        ((args->n + unaligned::kTile - 1) / unaligned::kTile);
  return for_each_batch_chunk<Cfg>(*args, [&](const GemmArgs& chunk, unsigned problems) {
    slow<<<dim3(static_cast<unsigned>(tiles), problems), unaligned::kThreads, 0, stream>>>(chunk);
    return static_cast<int>(cudaGetLastError());
  });
}

// The small-M kernel of common/gemm_small_m.cuh: one block per 16 rows of a K-major W, 32 columns of an N-major B.
template <class Cfg>
inline int launch_small_m(void (*small)(GemmArgs), const GemmArgs* args, cudaStream_t stream) {
  constexpr int kColumns = small_m::kBlockColumns<Cfg>;
  const int64_t blocks = (args->n + kColumns - 1) / kColumns;
  return for_each_batch_chunk<Cfg>(*args, [&](const GemmArgs& chunk, unsigned problems) {
    small<<<dim3(static_cast<unsigned>(blocks), problems), small_m::kThreads, 0, stream>>>(chunk);
    return static_cast<int>(cudaGetLastError());
  });
}

// The kernel of a path other than the fast one, launched; -1 for the fast path (the caller's own launch).
template <class Cfg>
inline int launch_other_path(GemmPath path, void (*slow)(GemmArgs), void (*small)(GemmArgs), const GemmArgs* args,
                             cudaStream_t stream) {
  if (path == GEMM_PATH_UNALIGNED) return launch_unaligned<Cfg>(slow, args, stream);
  if (path == GEMM_PATH_SMALL_M) return launch_small_m<Cfg>(small, args, stream);
  return -1;
}

// Kernels may ask for more than 48 KB of shared memory only after opting in, and the opt-in is an attribute of the
// kernel on the current device: once per device (done on cuda:0 only, a launch on cuda:1 fails). `raised` is the
// caller's (one per kernel) record of the devices done; atomic, since threads on several GPUs launch at once (two
// threads may both set the attribute of one device, which is harmless).
using DeviceFlags = std::atomic<bool>[kMaxDevices];
inline cudaError_t raise_smem_limit(const void* kernel, int smem_bytes, DeviceFlags& raised, int* device_out) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device_out != nullptr) *device_out = device;
  if (device < kMaxDevices && raised[device].load(std::memory_order_acquire)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess && device < kMaxDevices) raised[device].store(true, std::memory_order_release);
  return err;
}

template <class Cfg>
inline int launch(void (*fast)(GemmArgs), void (*slow)(GemmArgs), void (*small)(GemmArgs),
                  void (*repack)(RepackArgs), int smem_bytes, const GemmArgs* call, cudaStream_t stream) {
  if (batch_invalid(*call)) return static_cast<int>(cudaErrorInvalidValue);
  // (kWalksGroups, kWalksLists: sm90 persistent only)
  if (is_grouped(*call) || is_list(*call)) return static_cast<int>(cudaErrorNotSupported);
  if (call->m <= 0 || call->n <= 0) return 0;
  const GemmArgs folded = fold_batch<Cfg>(*call);
  const GemmArgs* args = &folded;
  const GemmPath path = choose_folded_path<Cfg>(*args);
  if (path == GEMM_PATH_REPACKED) {
    return launch_repacked<Cfg>(repack, args, stream, [&](const GemmArgs* packed) -> int {
      return launch<Cfg>(fast, slow, small, repack, smem_bytes, packed, stream);
    });
  }
  if (path != GEMM_PATH_FAST) return launch_other_path<Cfg>(path, slow, small, args, stream);
  static DeviceFlags smem_raised = {};
  const cudaError_t err = raise_smem_limit(reinterpret_cast<const void*>(fast), smem_bytes, smem_raised, nullptr);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t tiles = ((args->m + Cfg::kBlockM - 1) / Cfg::kBlockM) * ((args->n + Cfg::kBlockN - 1) / Cfg::kBlockN);
  return for_each_batch_chunk<Cfg>(*args, [&](const GemmArgs& chunk, unsigned problems) {
    fast<<<dim3(static_cast<unsigned>(tiles), problems), Cfg::kThreads, smem_bytes, stream>>>(chunk);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace gemmgen
