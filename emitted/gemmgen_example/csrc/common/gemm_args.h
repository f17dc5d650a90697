// The plain C interface between a generated kernel library and its host caller.
// Kept free of torch and of C++-only types so that ctypes (and any C caller) can fill it.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// D (m x n) = A (m x k) * B (k x n). Leading dimensions are in elements and follow the storage
// order the kernel was generated for: lda is the stride between rows of a row-major A, or between
// columns of a column-major A; likewise ldb and ldd.
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
} GemmArgs;

// Which kernel of a library a launch takes (returned by <name>_path).
enum GemmPath { GEMM_PATH_FAST = 0, GEMM_PATH_UNALIGNED = 1 };

#ifdef __cplusplus
}
#endif
