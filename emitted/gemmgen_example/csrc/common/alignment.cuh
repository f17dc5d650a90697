// The 16-byte rule of the fast kernels: cp.async (sm80) moves 16-byte chunks, and TMA (sm90) takes only
// 16-byte-aligned base addresses and row pitches. One place for the host's choice of kernel and the
// sm90 epilogue's choice of TMA stores.
#pragma once

#include <cstdint>

namespace gemmgen {

constexpr int kFastAlignBytes = 16;

// A matrix at `base` whose rows (or columns) are `ld` elements of `elem_bytes` apart: every 16-byte
// chunk of it is 16-byte aligned.
__host__ __device__ inline bool fast_aligned(const void* base, int64_t ld, int64_t elem_bytes) {
  return reinterpret_cast<uintptr_t>(base) % kFastAlignBytes == 0 && (ld * elem_bytes) % kFastAlignBytes == 0;
}

}  // namespace gemmgen
