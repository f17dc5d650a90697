// The plain C interface between a generated kernel library and its host caller.
// Kept free of torch and of C++-only types so that ctypes (and any C caller) can fill it.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The most extra operands a fused epilogue takes (MAX_EPILOGUE_OPERANDS in generator/spec/config.py).
#define GEMMGEN_MAX_EPILOGUE_OPERANDS 8

// The K extent of one per-block scale of fp8 A and B (SCALE_BLOCK in generator/spec/epilogue/operands.py): A's scales
// are (M, ceil(K / 128)), one per row and 128-wide K block; B's (ceil(N / 128), ceil(K / 128)), one per
// 128 x 128 block; both fp32, row-major, their leading dimension in ep_ld.
#define GEMMGEN_SCALE_BLOCK_K 128

// One problem of a list of problems (GemmArgs::list): its own matrices, sizes and leading dimensions, in the
// orders of the kernel's plan (as GemmArgs' a, b, d, m, n, k, lda, ldb, ldd).
typedef struct GemmListProblem {
  const void* a;
  const void* b;
  void* d;
  int64_t m;
  int64_t n;
  int64_t k;
  int64_t lda;
  int64_t ldb;
  int64_t ldd;
} GemmListProblem;

// D (m x n) = epilogue(A (m x k) * B (k x n), operands...). Leading dimensions are in elements and follow
// the storage order the kernel was generated for: lda is the stride between rows of a row-major A, or
// between columns of a column-major A; likewise ldb, ldd, the matrix operands' and the second output's.
typedef struct GemmArgs {
  const void* a;
  const void* b;
  void* d;
  int64_t m;
  int64_t n;
  int64_t k;
  int64_t lda;
  int64_t ldb;
  int64_t ldd;
  // The fused epilogue's operands, in the plan's order (slot i = operand i): a tensor's base address (a
  // vector's, a matrix's, a one-element scale's or per-block scales') and (matrices, per-block scales) leading
  // dimension, a scalar's value. Unused slots stay zero.
  const void* ep_ptr[GEMMGEN_MAX_EPILOGUE_OPERANDS];
  int64_t ep_ld[GEMMGEN_MAX_EPILOGUE_OPERANDS];
  float ep_scalar[GEMMGEN_MAX_EPILOGUE_OPERANDS];
  // The epilogue's second output (same dtype and order as D), or null when the plan has none.
  void* aux;
  int64_t ldaux;
  // A batch of problems (batch > 1): D[b] = epilogue(A[b] * B[b]) for b < batch, each of the same m, n, k and
  // leading dimensions, operand X's matrix b at X + b * batch_stride_x elements; a stride of 0 gives every
  // problem the same matrix (x @ W on a 3-D x). The epilogue's operands are the same for every problem (scalars
  // and vectors only: a batched call takes no matrix operand and no second output). batch 0 or 1: one problem.
  int64_t batch;
  int64_t batch_stride_a;
  int64_t batch_stride_b;
  int64_t batch_stride_d;
  // Grouped rows (a mixture of experts' tokens sorted by expert): non-null, batch (>= 1) int32 group ends on the
  // device, nondecreasing; group g is rows [group_ends[g - 1], group_ends[g]) of A and D (group 0 from row 0), m
  // rows in all, multiplied by B's matrix g (batch_stride_b apart). A and D are one matrix each (their batch
  // strides 0). Ends past m or below the previous end are clamped to them: rows outside every group are not
  // written. Only the sm90 persistent kernels take it; null: not grouped.
  const int32_t* group_ends;
  // Masked groups (DeepGEMM's masked layout: decode steps and CUDA graphs, where each expert's rows sit in a slab
  // of their own): group_rows > 0 makes group_ends each group's row count instead of its end; group g is rows
  // [g * group_rows, g * group_rows + count[g]) of A and D, m = batch * group_rows. A count below 0 or past
  // group_rows is clamped into [0, group_rows]; the rows of a slab past its count are not written. 0: the ends above.
  int64_t group_rows;
  // A list of problems (CUTLASS's GroupedGemm): non-null, `batch` (>= 1) problems on the host, each with its own
  // matrices and sizes (D[i] = A[i] * B[i]; a, b, d, m, n, k and the leading dimensions above are unused). The
  // launch reads the list on the host and walks all problems' tiles in one launch. Only the sm90 persistent kernels
  // take it, with the identity epilogue; null: not a list.
  const GemmListProblem* list;
  // Set by the launch, null from its caller: the list's per-problem tensor maps and sizes on the device.
  const void* list_device;
  // Groups along K (the weight gradient of grouped rows: dW[g] = X[rows of g].t() @ dY[rows of g]): nonzero with
  // group_ends makes the ends split K instead of M. Group g is k values [group_ends[g - 1], group_ends[g]) of A (m x k)
  // and B (k x n), one matrix each (their batch strides 0), and D[g] (batch_stride_d apart, batch = the groups) is
  // their product, zeros for an empty group; k is the ends' total, at least 1. Ends are clamped as for grouped rows.
  // Only the sm90 persistent kernels that take lists (Cfg::kWalksLists) take it: the launch builds each group's
  // tensor maps on the device, so nothing is read on the host.
  int64_t groups_along_k;
  // A quantized D's amax (plans with KernelConfig.amax): one fp32, zero before the launch, that the kernel raises to
  // the largest |value| of D before quantization (atomic max on the float's bits: every value is >= 0); null
  // otherwise.
  float* amax;
} GemmArgs;

// Which kernel of a library a launch takes (returned by <name>_path): the config's own, the unaligned one
// (common/gemm_unaligned.cuh), the small-M one (common/gemm_small_m.cuh), or the config's own (or the small-M one)
// on aligned copies of the operands that break the 16-byte rule (common/workspace.cuh).
// A grouped call (group_ends or list) takes the config's own kernel walking the groups (GEMM_PATH_GROUPED), or none
// (GEMM_PATH_NONE: a library without that kernel, or operands off the 16-byte rule; its launch refuses the call).
enum GemmPath {
  GEMM_PATH_NONE = -1,
  GEMM_PATH_FAST = 0,
  GEMM_PATH_UNALIGNED = 1,
  GEMM_PATH_SMALL_M = 2,
  GEMM_PATH_REPACKED = 3,
  GEMM_PATH_GROUPED = 4
};

#ifdef __cplusplus
}
#endif
