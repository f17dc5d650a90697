// The order in which a persistent grid's blocks take their work units: by the SM each block lands on.
//
// A grid of one block per SM hands its blocks to the SMs in a fixed pattern (on an H200: blocks 0-7 to SMs 124-131,
// then runs of eight blocks to eight SMs of one GPC, the runs alternating between SMs 0-63 and 64-131:
// gpu/sm_layout_probe.py). Units next to each other in the raster share rows of A or columns of B, and which SMs run
// them changes how fast L2 serves them (why this order wins is not understood yet). Ranked by their SM's index
// instead of their launch order (block b takes unit rank(smid(b)) first), 51
// (shape, 1x1 kernel) pairs of more units than half the SMs ran 1.041x as fast (geomean; 25 of them 2-20 % faster,
// 2 of them 5-7 % slower; H200, docs/corpus.md, "Where the blocks of a one-wave grid land"). Clustered grids keep
// the launch order, which for clusters of two already follows the SMs' indices (after the first four).
//
// The pattern is measured once per device and process (record_block_sms, outside any graph capture) and passed to
// the kernel as a permutation of the block indices (LaunchWorkspace::order): every block still takes a unit of its
// own, so a launch whose blocks land elsewhere (another kernel holding SMs, a partitioned GPU) is as correct as
// before, only not ordered.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <cuda_runtime.h>

#include "../common/launch.cuh"
#include "gemm_kernel.cuh"

// 0: blocks take units in launch order (for A/B runs: gpu/ab_variants.py).
#ifndef GEMMGEN_SM90_BLOCK_ORDER
#define GEMMGEN_SM90_BLOCK_ORDER 1
#endif

namespace gemmgen {
namespace sm90 {
namespace {

// The SM each block landed on (255 for an index past 254). Launched with a whole SM's shared memory per block.
__global__ void record_block_sms(uint8_t* sms) {
  if (threadIdx.x == 0) {
    const uint32_t sm = ptx::sm_id();
    sms[blockIdx.x] = static_cast<uint8_t>(sm < 255u ? sm : 255u);
  }
}

struct BlockOrder {
  int blocks = 0;  // 0: none (not measured, or the blocks did not land one per SM)
  uint8_t order[kMaxOrderedBlocks] = {};
};

// Which SM each block of a grid of `sms` blocks lands on when each needs a whole SM's shared memory: the rank of that
// SM's index among the grid's. Blocks that share an SM (others' work held some SMs) or an SM index past 254 give none.
inline BlockOrder measure_block_order(int device, int sms) {
  BlockOrder none;
  if (sms < 1 || sms > kMaxOrderedBlocks) return none;
  int smem = 0;
  if (cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return none;
  const void* probe = reinterpret_cast<const void*>(record_block_sms);
  if (cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return none;
  cudaStream_t stream = nullptr;  // its own, non-blocking: no wait on (or of) the caller's work
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return none;
  uint8_t landed[kMaxOrderedBlocks] = {};
  void* on_device = nullptr;
  cudaError_t err = cudaMallocAsync(&on_device, sms, stream);
  if (err == cudaSuccess) {
    record_block_sms<<<sms, 32, smem, stream>>>(static_cast<uint8_t*>(on_device));
    err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaMemcpyAsync(landed, on_device, sms, cudaMemcpyDeviceToHost, stream);
    cudaFreeAsync(on_device, stream);
  }
  if (cudaStreamSynchronize(stream) != cudaSuccess) err = cudaErrorUnknown;
  cudaStreamDestroy(stream);
  if (err != cudaSuccess) {
    cudaGetLastError();  // (the probe's failure is not the caller's)
    return none;
  }
  uint8_t sorted[kMaxOrderedBlocks];
  std::copy(landed, landed + sms, sorted);
  std::sort(sorted, sorted + sms);
  if (sorted[sms - 1] == 255 || std::adjacent_find(sorted, sorted + sms) != sorted + sms) return none;
  BlockOrder measured;
  measured.blocks = sms;
  for (int b = 0; b < sms; ++b)
    measured.order[b] = static_cast<uint8_t>(std::lower_bound(sorted, sorted + sms, landed[b]) - sorted);
  return measured;
}

// The device's block order, measured on first use (null: none). Not measured while `stream` is being captured (the
// probe's synchronization would break the capture): such a launch runs in launch order, and a later one measures.
inline const BlockOrder* block_order(int device, cudaStream_t stream) {
  static std::atomic<int> state[kMaxDevices] = {};  // 0: not measured, 1: measured (maybe none)
  static BlockOrder orders[kMaxDevices];
  static std::mutex measuring;
  if (!GEMMGEN_SM90_BLOCK_ORDER || device < 0 || device >= kMaxDevices) return nullptr;
  if (state[device].load(std::memory_order_acquire) == 0) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
      return nullptr;
    std::lock_guard<std::mutex> held(measuring);
    if (state[device].load(std::memory_order_relaxed) == 0) {
      int sms = 0;
      if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess)
        orders[device] = measure_block_order(device, sms);
      state[device].store(1, std::memory_order_release);
    }
  }
  return orders[device].blocks > 0 ? &orders[device] : nullptr;
}

}  // namespace
}  // namespace sm90
}  // namespace gemmgen
