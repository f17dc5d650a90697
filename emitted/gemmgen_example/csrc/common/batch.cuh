// Batched problems (GemmArgs::batch > 1): D[b] = epilogue(A[b] * B[b]), every problem of the same shape, operand
// X's matrix b at X + b * batch_stride_x elements (0: one matrix for every problem).
//
// Kernels that address their operands through pointers (sm80's, the unaligned and the small-M kernel) take the
// problem from blockIdx.y and see it as a single problem: problem_args shifts the three bases. The sm90 kernel
// addresses A, B and D through TMA tensor maps with the batch as their third dimension and walks (problem, tile)
// work units (sm90/gemm_kernel.cuh). The host folds a batch that is one tall problem into one (fold_batch).
#pragma once

#include <cstdint>

#include "alignment.cuh"
#include "gemm_args.h"

namespace gemmgen {

// A grid's y extent is at most 65535: more problems are launched in chunks of this many.
constexpr int64_t kMaxBatchPerLaunch = 65535;

__host__ __device__ __forceinline__ int64_t batch_count(const GemmArgs& args) {
  return args.batch > 1 ? args.batch : 1;
}

// Grouped rows (GemmArgs::group_ends): the groups are the problems, of data-dependent sizes.
__host__ __device__ __forceinline__ bool is_grouped(const GemmArgs& args) { return args.group_ends != nullptr; }

// A list of problems (GemmArgs::list), each of its own sizes and matrices.
__host__ __device__ __forceinline__ bool is_list(const GemmArgs& args) { return args.list != nullptr; }

// Groups along K (GemmArgs::groups_along_k): the ends split K, each group's product a matrix of D.
__host__ __device__ __forceinline__ bool is_k_grouped(const GemmArgs& args) {
  return is_grouped(args) && args.groups_along_k != 0;
}

// Masked groups (GemmArgs::group_rows): each group's rows in a slab of its own, group_ends holding the counts.
__host__ __device__ __forceinline__ bool is_masked(const GemmArgs& args) {
  return is_grouped(args) && args.group_rows > 0;
}

// Arguments no launch can honour: a negative batch, a batch whose problems would all write one D, groups
// without a count, or grouped A or D given batch strides (they are one matrix each, split by rows), masked slabs
// that do not tile m (or a negative slab), a list without problems or also grouped, slabs without groups; groups
// along K without ends, with no K, with A or B given batch strides or with their products all written to one D.
__host__ __device__ inline bool batch_invalid(const GemmArgs& args) {
  if (is_list(args)) return args.batch < 1 || is_grouped(args);
  if (args.groups_along_k != 0) {
    return !is_grouped(args) || args.batch < 1 || args.group_rows != 0 || args.k < 1 || args.batch_stride_a != 0 ||
           args.batch_stride_b != 0 || (args.batch > 1 && args.batch_stride_d == 0);
  }
  if (args.group_rows != 0 && (!is_grouped(args) || args.group_rows < 0 || args.group_rows * args.batch != args.m))
    return true;
  if (is_grouped(args)) return args.batch < 1 || args.batch_stride_a != 0 || args.batch_stride_d != 0;
  return args.batch < 0 || (args.batch > 1 && args.batch_stride_d == 0);
}

// Problem `b` of a batch as a single problem: the bases of A, B and D moved to its matrices (elements of the
// config's types).
template <class Cfg>
__host__ __device__ __forceinline__ GemmArgs problem_args(const GemmArgs& args, int64_t b) {
  GemmArgs one = args;
  one.a = static_cast<const typename Cfg::Elem*>(args.a) + b * args.batch_stride_a;
  one.b = static_cast<const typename Cfg::ElemB*>(args.b) + b * args.batch_stride_b;
  one.d = static_cast<typename Cfg::Out*>(args.d) + b * args.batch_stride_d;
  one.batch = 1;
  return one;
}

// Whether every matrix of an operand keeps the 16-byte rule: its base and leading dimension (fast_aligned), and,
// in a batch, the stride between its matrices.
__host__ __device__ inline bool batch_aligned(const GemmArgs& args, const void* base, int64_t ld, int64_t stride,
                                              int64_t elem_bytes) {
  return fast_aligned(base, ld, elem_bytes) && (batch_count(args) == 1 || (stride * elem_bytes) % kFastAlignBytes == 0);
}

// A batch that is one problem with more rows or columns, as one problem: the shared operand's single matrix times
// the other's matrices stacked back to back along M (row-major A and D, B shared) or along N (K-major B and
// column-major D, A shared), where the epilogue reads no vector along that dimension. One launch of bigger
// tiles then fills the GPU better than a batch of small ones.
template <class Cfg>
inline GemmArgs fold_batch(const GemmArgs& args) {
  constexpr int64_t kInt32Max = 2147483647;
  const int64_t batch = batch_count(args);
  GemmArgs folded = args;
  if (batch == 1 || is_grouped(args) || is_list(args)) return folded;
  // The stacked operand's matrices (and D's) follow each other at exactly one matrix's pitch.
  const bool rows_stack = args.batch_stride_b == 0 && !Cfg::Epilogue::kReadsRows && Cfg::kAKMajor &&
                          Cfg::kDRowMajor && args.batch_stride_a == args.m * args.lda &&
                          args.batch_stride_d == args.m * args.ldd && args.m * batch <= kInt32Max;
  const bool cols_stack = args.batch_stride_a == 0 && !Cfg::Epilogue::kReadsCols && Cfg::kBKMajor &&
                          !Cfg::kDRowMajor && args.batch_stride_b == args.n * args.ldb &&
                          args.batch_stride_d == args.n * args.ldd && args.n * batch <= kInt32Max;
  if (rows_stack) folded.m = args.m * batch;
  if (cols_stack) folded.n = args.n * batch;
  if (rows_stack || cols_stack) folded.batch = 1;
  return folded;
}

}  // namespace gemmgen
