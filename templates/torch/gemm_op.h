// The torch side of a gemmgen op: argument checks, allocation and launch of a kernel library's entry
// point, the Meta (fake) implementation and the .out decomposition, as dispatcher kernels. The autograd
// formula is torch/gemm_autograd.h (a header of its own: torch's autograd headers double the compile
// time of a file that includes them, and a package emitted without autograd does not need them).
//
// Shared by the two ways an op reaches torch: an emitted package's binding.cpp (its ops are fixed when it
// is generated: one constant OpSpec each) and gemmgen's JIT runtime (templates/torch/jit_runtime.cpp,
// one OpSpec per kernel library loaded at run time). This header and those two files are the only ones
// that include torch headers; the kernels are plain CUDA with the C interface of common/gemm_args.h.
// The messages are generator/runtime/op_checks.py's (OpChecks._check*) and, for a fused epilogue's operands,
// generator/runtime/operands.py's, so an op says the same whichever way it was built.
//
// A and B are 2-D, or either or both 3-D for a batch of problems (D[b] = epilogue(A[b] @ B[b]), D 3-D): Problem
// and batch_size below, GemmArgs' batch fields; a 2-D call leaves those 0. A plain op's .grouped overload takes a
// mixture of experts' rows (gemm_grouped: A (total_M, K) sorted by group, B (E, K, N), int32 offsets (E,), the
// groups' ends; GemmArgs' group_ends), and its .grouped_list overload a list of problems of their own sizes
// (gemm_grouped_list: A[i] (M_i, K_i), B[i] (K_i, N_i) -> D[i]; GemmArgs' list).
//
// A plain op, (A, B) -> D, has unboxed kernels (one functor type per overload, below). An op with a fused
// epilogue takes its operands after A and B (float for a scalar, Tensor for the other kinds) and may
// return a second output, so its schema differs from op to op; its kernels are boxed (EpilogueKernel and
// the others at the end of this file): they read the arguments off the dispatcher's stack as the OpSpec's
// operand list describes them, fill GemmArgs' epilogue slots, and push the outputs.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include "common/gemm_args.h"

// Hidden: an emitted package and the JIT runtime (or two packages emitted by different gemmgen versions)
// may be loaded into one process, each with its own copy of these inline functions and of the
// dispatcher's templates instantiated for the kernel types below; hidden symbols are never shared
// between libraries, so each library runs its own copy.
namespace __attribute__((visibility("hidden"))) gemmgen {

using LaunchFn = int (*)(const GemmArgs*, void*);
using ErrorStringFn = const char* (*)(int);

// The kinds of a fused epilogue's operand (generator/spec/epilogue/operands.py KINDS, in that order): a scalar (by
// value), per-row and per-column vectors, an M x N matrix, a one-element fp32 tensor read on the device, and the
// per-block fp32 scales of A (M, ceil(K/128)) and of B (ceil(N/128), ceil(K/128)) that the main loop applies.
enum class OperandKind : int {
  Scalar = 0, Row = 1, Col = 2, Matrix = 3, ScalarTensor = 4, RowBlocks = 5, ColBlocks = 6
};
inline constexpr int kOperandKinds = 7;

// One operand of a fused epilogue, in the op's schema order (after A and B); operand i goes to slot i of
// GemmArgs' ep_ptr / ep_ld / ep_scalar.
struct OperandSpec {
  OperandKind kind;
  const char* name;         // its name in the schema and in the messages
  c10::ScalarType dtype;    // the element type the kernel reads (Float for a scalar, passed as fp32, and the scales)
  const char* dtype_name;   // "fp16" | "bf16" | "fp32"
  bool row;                 // a matrix: stored row-major (false: column-major); unused otherwise
};

// Everything the checks and the launch need to know about one op.
struct OpSpec {
  const char* ns;                // the op's namespace: torch.ops.<ns>.<op>
  const char* op;                // the op's name in that namespace
  const char* kernel;            // the kernel behind it
  int arch;                      // the compute capability it was planned for (90 = 9.0)
  c10::ScalarType dtype;         // of A and B
  const char* dtype_name;
  c10::ScalarType out_dtype;     // of D
  const char* out_dtype_name;
  bool a_row, b_row, d_row;      // storage orders: true = row-major, false = column-major
  const char* layout_a_flipped;  // the layout that would take A in the other order (for the advice)
  const char* layout_b_flipped;
  LaunchFn launch;
  ErrorStringFn error_string;
  // The fused epilogue: its operands (num_operands of them at operands; none for a plain op) and whether the op
  // returns a second output: the epilogue's aux (same dtype and order as D), or with quant_block a quantized D's
  // scales. Either makes the op's kernels the boxed ones.
  int num_operands;
  const OperandSpec* operands;
  bool aux;
  // The device type of the tensors the kernels take: CUDA. (gemmgen's CPU tests register CPU stand-in
  // kernels with CPU here, to run every check and the filling of GemmArgs without a GPU.)
  c10::DeviceType device_type;
  // B's element type where it differs from A's (fp8: e4m3 x e5m2); Undefined: B is dtype too.
  c10::ScalarType dtype_b = c10::ScalarType::Undefined;
  const char* dtype_b_name = nullptr;
  // Why the kernel library takes no grouped call (.grouped), with the fix (generator/spec/grouped.py's
  // grouped_refusal, decided from the config: the sm80 family, the ws schedule, stream-K); null: it takes them.
  const char* grouped_refusal = nullptr;
  // Why it takes no list call (.grouped_list), with the fix (grouped_list_refusal: grouped_refusal's rules but A's
  // order); null: it takes them.
  const char* grouped_list_refusal = nullptr;
  // An op over an M-bucketed op's kernels (generator/runtime/buckets.py BucketSetOp, what torch.compile'd graphs
  // call): a call of at most bucket_rows[i] rows (M, times the problems of a batch) takes kernel i; larger ones,
  // and grouped and list calls, the kernel above. num_buckets 0: one kernel.
  int num_buckets = 0;
  const int64_t* bucket_rows = nullptr;   // increasing
  const LaunchFn* bucket_launch = nullptr;
  const ErrorStringFn* bucket_error_string = nullptr;
  const char* const* bucket_kernel = nullptr;
  // A quantized (fp8) D: each row's blocks of quant_block columns scaled by one fp32 scale each, the scales the
  // second output ((M, ceil(N / quant_block)), row-major); 0: D is not quantized.
  int quant_block = 0;
  // With quant_block: the op also returns the amax of D before quantization, a 0-dim fp32 (GemmArgs::amax).
  bool amax = false;
};

// What the second output is called in messages.
inline const char* second_output_name(const OpSpec& op) { return op.quant_block > 0 ? "scales" : "aux"; }

inline c10::ScalarType b_dtype(const OpSpec& op) {
  return op.dtype_b == c10::ScalarType::Undefined ? op.dtype : op.dtype_b;
}

inline bool has_epilogue_schema(const OpSpec& op) { return op.num_operands > 0 || op.aux; }
inline bool on_cuda(const OpSpec& op) { return op.device_type == c10::DeviceType::CUDA; }

inline constexpr int64_t kInt32Max = 2147483647;
inline constexpr int kMaxDevices = 64;

// A size as text. Never through c10's operator<<(std::ostream&, const SymInt&): that one lives in libc10
// and would write into a stream of this library, and where the compiler links its C++ runtime statically
// (some GCC builds do) the two runtimes' streams are incompatible: a segfault instead of a message.
inline std::string size_str(int64_t v) { return std::to_string(v); }
inline std::string size_str(const c10::SymInt& v) {
  if (const auto concrete = v.maybe_as_int()) return std::to_string(*concrete);
  return v.toSymNode()->str();  // a symbolic size (torch.compile), e.g. "s0"
}

// Python's repr of a tuple: (2, 3), (5,), ().
template <class Values>
inline std::string tuple_str(const Values& values) {
  std::ostringstream s;
  s << "(";
  size_t count = 0;
  for (const auto& v : values) {
    if (count++) s << ", ";
    s << size_str(v);
  }
  if (count == 1) s << ",";
  s << ")";
  return s.str();
}

// A dtype's name in torch without the "torch." prefix: "float32".
inline std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    default: return c10::toString(t);
  }
}

inline std::string torch_dtype(c10::ScalarType t) { return "torch." + dtype_name(t); }

// The storage order of a matrix, or of each matrix of a 3-D tensor (its last two dimensions).
inline const char* order_str(const at::Tensor& t) {
  const bool matrices = t.dim() == 2 || t.dim() == 3;
  if (matrices && t.stride(-1) == 1) return "row-major";
  if (matrices && t.stride(-2) == 1) return "column-major";
  return "neither row- nor column-major";
}

// The leading dimension of a 2-D tensor (of each matrix of a 3-D one: its last two dimensions) stored
// row-major (row) or column-major, or -1 if it is not stored so. A dimension of size 1 has no meaningful
// stride; its leading dimension is the other size.
// Int: int64_t, or c10::SymInt for sizes that may be symbolic (torch.compile), whose comparisons add
// guards where int64_t sizes would specialize a dynamic dimension.
template <class Int>
inline Int leading_dim_of(const Int& rows, const Int& cols, const Int& stride0, const Int& stride1, bool row) {
  const Int one(1);
  if (row) {
    const bool inner_ok = cols <= one || stride1 == one;
    const Int ld = rows > one ? stride0 : std::max(cols, one);
    return inner_ok && ld >= std::max(cols, one) ? ld : Int(-1);
  }
  const bool inner_ok = rows <= one || stride0 == one;
  const Int ld = cols > one ? stride1 : std::max(rows, one);
  return inner_ok && ld >= std::max(rows, one) ? ld : Int(-1);
}

inline int64_t leading_dim(const at::Tensor& t, bool row) {
  return leading_dim_of<int64_t>(t.size(-2), t.size(-1), t.stride(-2), t.stride(-1), row);
}

// Whether t is stored in the order (row: row-major), for tensors whose sizes may be symbolic.
inline bool stored_in(const at::Tensor& t, bool row) {
  return leading_dim_of<c10::SymInt>(t.sym_size(-2), t.sym_size(-1), t.sym_stride(-2), t.sym_stride(-1), row) >=
         c10::SymInt(0);
}

// The elements between the matrices of a 3-D tensor (GemmArgs' batch strides): 0 for a 2-D tensor or a batch of
// one, whose one matrix every problem reads (or writes).
inline int64_t batch_stride(const at::Tensor& t) { return t.dim() == 3 && t.size(0) > 1 ? t.stride(0) : 0; }

inline bool is_batched(const at::Tensor& A, const at::Tensor& B) { return A.dim() == 3 || B.dim() == 3; }

// The number of problems of a batched call (3-D A or B; ranks checked): the batch of the 3-D operand(s), where a
// batch of 1 broadcasts against the other's, as in torch.matmul (generator/runtime/op_checks.py: batch_size).
// Sizes may be symbolic: the tests for 1 are size-oblivious, as torch's broadcasting (a dynamic batch is taken for
// not 1, without a guard), and equal batches a deferred run-time assertion (expect_true), as check_k's K.
inline c10::SymInt batch_size(const at::Tensor& A, const at::Tensor& B) {
  if (B.dim() != 3) return A.sym_size(0);
  if (A.dim() != 3) return B.sym_size(0);
  const c10::SymInt a = A.sym_size(0), b = B.sym_size(0);
  if (a.sym_eq(1).guard_size_oblivious(__FILE__, __LINE__)) return b;
  if (b.sym_eq(1).guard_size_oblivious(__FILE__, __LINE__)) return a;
  TORCH_CHECK_VALUE(a.sym_eq(b).expect_true(__FILE__, __LINE__), "A is ", tuple_str(A.sym_sizes()), " and B is ",
                    tuple_str(B.sym_sizes()),
                    ": their batch sizes must agree, or one be 1 (broadcast, as torch.matmul)");
  return a;
}

// D for A and B (ranks checked), allocated in the storage order the kernel writes: (M, N), or for a batched call
// (batch, M, N) with its matrices one after another (sizes may be symbolic: shared with the Meta impl).
inline at::Tensor empty_d(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  const c10::SymInt m = A.sym_size(-2), n = B.sym_size(-1);
  const at::TensorOptions options = A.options().dtype(op.out_dtype);
  if (!is_batched(A, B)) {
    if (op.d_row) return at::empty_symint({m, n}, options);
    return at::empty_symint({n, m}, options).t();
  }
  const c10::SymInt batch = batch_size(A, B);
  if (op.d_row) return at::empty_symint({batch, m, n}, options);
  return at::empty_symint({batch, n, m}, options).transpose(1, 2);
}

// The op's second output for A and B of a 2-D call (a batched one with a second output is refused first): a
// quantized D's scales (M, ceil(N / quant_block)) fp32, or the epilogue's aux (like D), or none.
inline at::Tensor empty_second_output(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  if (!op.aux) return at::Tensor();
  if (op.quant_block == 0) return empty_d(op, A, B);
  const c10::SymInt blocks = (B.sym_size(-1) + (op.quant_block - 1)) / op.quant_block;
  return at::empty_symint({A.sym_size(-2), blocks}, A.options().dtype(at::kFloat));
}

// The op's third output (OpSpec::amax): the amax of a quantized D, a 0-dim fp32 that starts at zero (the kernel raises
// it); none otherwise.
inline at::Tensor zeroed_amax(const OpSpec& op, const at::Tensor& A) {
  return op.amax ? at::zeros({}, A.options().dtype(at::kFloat)) : at::Tensor();
}

// -- checks ------------------------------------------------------------------------------------------

// The form of a call, for the rank its A and B must have: a plain call (2-D, or 3-D for a batch), a grouped call
// of rows (A 2-D, B 3-D: gemm_grouped), a list call (each A[i] and B[i] 2-D: gemm_grouped_list), or a grouped
// call along K (A and B 2-D: gemm_grouped_k).
enum class CallForm { plain, grouped, list, k_grouped };

// Rank and dtype of A or B (what: "A", "B", or a list call's "A[i]", "B[i]"): the checks that need no data (the
// Meta impl runs them too).
inline void check_rank_and_dtype(const OpSpec& op, const at::Tensor& t, const char* what,
                                 CallForm form = CallForm::plain) {
  TORCH_CHECK_TYPE(t.defined(), what, " must be a torch.Tensor, got NoneType");  // None from torch.ops
  const bool is_a = what[0] == 'A';
  if (form == CallForm::grouped) {
    TORCH_CHECK_VALUE(t.dim() == (is_a ? 2 : 3), what, " must be ",
                      is_a ? "2-D (total_M, K) for a grouped call: every group's rows, sorted by group"
                           : "3-D (E, K, N) for a grouped call: one matrix per group (expert)",
                      "; got shape ", tuple_str(t.sym_sizes()));
  }
  if (form == CallForm::list) {
    TORCH_CHECK_VALUE(t.dim() == 2, what, " must be 2-D ", is_a ? "(M, K)" : "(K, N)",
                      " for a list call: one matrix per problem; got shape ", tuple_str(t.sym_sizes()));
  }
  if (form == CallForm::k_grouped) {
    TORCH_CHECK_VALUE(t.dim() == 2, what, " must be 2-D ", is_a ? "(M, K)" : "(K, N)",
                      " for a grouped call along K (B 2-D): offsets split K; got shape ", tuple_str(t.sym_sizes()));
  }
  TORCH_CHECK_VALUE(t.dim() == 2 || t.dim() == 3, what, " must be 2-D ", is_a ? "(M, K)" : "(K, N)", " or 3-D ",
                    is_a ? "(batch, M, K)" : "(batch, K, N)", "; got shape ", tuple_str(t.sym_sizes()));
  // Planning with the tensor's dtype is a fix only where a plan can take it (fp32: tf32 on sm90).
  const bool plannable = t.scalar_type() == c10::ScalarType::Half || t.scalar_type() == c10::ScalarType::BFloat16 ||
                         t.scalar_type() == c10::ScalarType::Float ||
                         t.scalar_type() == c10::ScalarType::Float8_e4m3fn ||
                         t.scalar_type() == c10::ScalarType::Float8_e5m2 || t.scalar_type() == c10::ScalarType::Char;
  const c10::ScalarType want = is_a ? op.dtype : b_dtype(op);
  const char* want_name = is_a || op.dtype_b_name == nullptr ? op.dtype_name : op.dtype_b_name;
  // B of the other fp8 format: a mixed plan (dtype_b); any other B: a plan of B's dtype.
  const auto fp8 = [](c10::ScalarType s) {
    return s == c10::ScalarType::Float8_e4m3fn || s == c10::ScalarType::Float8_e5m2;
  };
  const bool mix = !is_a && fp8(t.scalar_type()) && fp8(op.dtype);
  TORCH_CHECK_TYPE(t.scalar_type() == want, what, " is ", torch_dtype(t.scalar_type()), "; this plan computes ",
                   want_name, ": pass ", what, ".to(", torch_dtype(want), ")",
                   plannable ? std::string(" or plan with ") + (mix ? "dtype_b" : "dtype") + "='" +
                                   dtype_name(t.scalar_type()) + "'"
                             : std::string());
}

// A or B on the GPU (2-D, or 3-D: a batch of matrices, each stored in the order, any batch stride; a grouped call's
// A 2-D and B 3-D; a list call's A[i] and B[i] 2-D); returns its leading dimension.
inline int64_t check_operand(const OpSpec& op, const at::Tensor& t, const char* what, bool row,
                             CallForm form = CallForm::plain) {
  check_rank_and_dtype(op, t, what, form);
  TORCH_CHECK_VALUE(t.device().type() == op.device_type, what, " is on ", t.device().str(),
                    "; this op runs on CUDA tensors: pass ", what, ".cuda()");
  const int64_t ld = leading_dim(t, row);
  const bool is_a = what[0] == 'A';
  TORCH_CHECK_VALUE(ld >= 0, what, " has strides ", tuple_str(t.strides()), " (", order_str(t),
                    "); this plan was made for layout_", is_a ? "a" : "b", "='", row ? "row" : "col",
                    "': plan with layout='", is_a ? op.layout_a_flipped : op.layout_b_flipped, "' or pass ", what,
                    row                ? ".contiguous()"
                    : t.dim() == 2     ? ".t().contiguous().t() (a column-major copy)"
                                       : ".transpose(-1, -2).contiguous().transpose(-1, -2) (a column-major copy)");
  return ld;
}

// A and B on one device (cuda:0 and cuda:1 are two): the launch runs on A's, where B's memory is not.
inline void check_same_device(const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK_VALUE(A.device() == B.device(), "A is on ", A.device().str(), " and B on ", B.device().str(),
                    ": put both on one GPU, e.g. pass B.to('", A.device().str(), "')");
}

inline void check_k(const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK_VALUE(A.sym_size(-1).sym_eq(B.sym_size(-2)).expect_true(__FILE__, __LINE__), "A is ",
                    tuple_str(A.sym_sizes()), " and B is ", tuple_str(B.sym_sizes()),
                    ": K must agree (A's columns = B's rows); for x @ W.t() pass B = W.t()");
}

inline void check_index(const char* what, int64_t size) {
  TORCH_CHECK_VALUE(size <= kInt32Max, what, "=", size, " is larger than the kernels index (2**31 - 1): split the problem");
}

// M, N and K of a problem within the kernels' int32 index (op_checks.py's _check_index).
inline void check_sizes(int64_t m, int64_t n, int64_t k) {
  check_index("M", m);
  check_index("N", n);
  check_index("K", k);
}

// A call's GEMM as its checked A and B describe it (op_checks.py's Problem): GemmArgs' sizes and leading dimensions,
// and for a batched call (3-D A or B) the number of problems and A's and B's batch strides (elements; 0: one matrix for
// every problem).
struct Problem {
  int64_t m, n, k, lda, ldb;
  bool batched;  // false: one problem (2-D A and B), GemmArgs' batch fields left 0
  int64_t batch, batch_stride_a, batch_stride_b;
};

inline Problem check_operands(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  const int64_t lda = check_operand(op, A, "A", op.a_row);
  const int64_t ldb = check_operand(op, B, "B", op.b_row);
  check_same_device(A, B);
  check_k(A, B);
  const bool batched = is_batched(A, B);
  const int64_t batch = batched ? batch_size(A, B).expect_int() : 0;
  check_sizes(A.size(-2), B.size(-1), A.size(-1));
  if (batched) check_index("batch", batch);
  return Problem{A.size(-2), B.size(-1), A.size(-1), lda, ldb, batched, batch, batch_stride(A), batch_stride(B)};
}

// An out in the op's order of D, for messages.
inline const char* out_fix(const OpSpec& op, bool batched) {
  if (!batched) return op.d_row ? "torch.empty(M, N)" : "torch.empty(N, M).t()";
  return op.d_row ? "torch.empty(batch, M, N)" : "torch.empty(batch, N, M).transpose(1, 2)";
}

// Shape and dtype of out (the Meta impl runs this too): (M, N), or (batch, M, N) for a batched call.
inline void check_out_shape_and_dtype(const OpSpec& op, const at::Tensor& out, const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK_TYPE(out.defined(), "out must be a torch.Tensor, got NoneType");
  std::vector<c10::SymInt> shape = {A.sym_size(-2), B.sym_size(-1)};
  if (is_batched(A, B)) shape.insert(shape.begin(), batch_size(A, B));
  bool same = out.dim() == static_cast<int64_t>(shape.size());
  for (size_t d = 0; same && d < shape.size(); ++d) {
    same = out.sym_size(static_cast<int64_t>(d)).sym_eq(shape[d]).expect_true(__FILE__, __LINE__);
  }
  std::string sizes;  // "2, 33, 40"
  for (const auto& s : shape) sizes += (sizes.empty() ? "" : ", ") + size_str(s);
  TORCH_CHECK_VALUE(same, "out has shape ", tuple_str(out.sym_sizes()), "; D = A @ B is (", sizes,
                    "): pass torch.empty(", sizes, ", dtype=", torch_dtype(op.out_dtype), ", device='",
                    A.device().str(), "')");
  TORCH_CHECK_TYPE(out.scalar_type() == op.out_dtype, "out is ", torch_dtype(out.scalar_type()),
                   "; this plan writes ", op.out_dtype_name, ": pass an out of dtype ", torch_dtype(op.out_dtype),
                   " or plan with out_dtype='", dtype_name(out.scalar_type()), "'");
}

// out on the GPU; returns its leading dimension and batch stride (elements; 0 for a 2-D call).
inline std::pair<int64_t, int64_t> check_out(const OpSpec& op, const at::Tensor& out, const at::Tensor& A,
                                             const at::Tensor& B) {
  check_out_shape_and_dtype(op, out, A, B);
  TORCH_CHECK_VALUE(out.device() == A.device(), "out is on ", out.device().str(), " but A and B on ",
                    A.device().str(), ": allocate out on ", A.device().str());
  const bool batched = is_batched(A, B);
  const int64_t ld = leading_dim(out, op.d_row);
  TORCH_CHECK_VALUE(ld >= 0, "out has strides ", tuple_str(out.strides()), " (", order_str(out),
                    "); this plan writes D ", op.d_row ? "row" : "col", "-major: pass out=", out_fix(op, batched),
                    " or plan with layout_c='", op.d_row ? "col" : "row", "'");
  const int64_t stride = batch_stride(out);
  // (an expanded tensor) every problem would write one D; an empty out is written by none: any strides
  TORCH_CHECK_VALUE(!(batched && out.size(0) > 1 && stride == 0 && out.numel() > 0), "out has strides ",
                    tuple_str(out.strides()),
                    ": with a batch stride of 0, all ", out.size(0), " problems would write the same D; pass out=",
                    out_fix(op, true));
  return {ld, stride};
}

// -- the epilogue's operands (generator/runtime/operands.py: check_static, check_operand) ------------

inline const char* operand_shape(const OperandSpec& o) {
  switch (o.kind) {
    case OperandKind::Scalar: return "()";
    case OperandKind::Row: return "(M,)";
    case OperandKind::Col: return "(N,)";
    case OperandKind::Matrix: return "(M, N)";
    case OperandKind::ScalarTensor: return "(1,)";
    case OperandKind::RowBlocks: return "(M, ceil(K/128))";
    case OperandKind::ColBlocks: return "(ceil(N/128), ceil(K/128))";
  }
  return "?";
}
static_assert(GEMMGEN_SCALE_BLOCK_K == 128, "operand_shape spells the scale block's K extent");

inline bool is_block_scales(const OperandSpec& o) {
  return o.kind == OperandKind::RowBlocks || o.kind == OperandKind::ColBlocks;
}

// ceil(size / GEMMGEN_SCALE_BLOCK_K): the number of per-block scales along a dimension.
inline int64_t scale_blocks(int64_t size) { return (size + GEMMGEN_SCALE_BLOCK_K - 1) / GEMMGEN_SCALE_BLOCK_K; }

// Whether declaring the operand with the tensor's dtype is a fix: only for a dtype an operand may have (fp16,
// bf16, fp32; not float64, say), of an operand whose dtype the user chose (not a scale's, always fp32).
inline bool dtype_declarable(const OperandSpec& o, c10::ScalarType got) {
  const bool operand_dtype = got == c10::ScalarType::Half || got == c10::ScalarType::BFloat16 ||
                             got == c10::ScalarType::Float;
  const bool chosen = o.kind == OperandKind::Row || o.kind == OperandKind::Col || o.kind == OperandKind::Matrix;
  const bool scale = std::string(o.name) == "scale_a" || std::string(o.name) == "scale_b";
  return operand_dtype && chosen && !scale;
}

inline std::string scalar_tensor_message(const OperandSpec& o, const std::string& shape) {
  return std::string(o.name) + " has shape " + shape +
         "; a per-tensor scale is one element, shape (1,) or (): pass a one-element fp32 tensor";
}

// The tensor of a Tensor argument on the stack: torch.ops passes None as an undefined tensor.
inline const at::Tensor& tensor_value(const c10::IValue& value) {
  static const at::Tensor undefined;
  return value.isTensor() ? value.toTensor() : undefined;
}

// A scalar operand's value (the schema's float; an int from a C++ caller is taken too).
inline float scalar_value(const OperandSpec& o, const c10::IValue& value) {
  if (value.isDouble()) return static_cast<float>(value.toDouble());
  if (value.isInt()) return static_cast<float>(value.toInt());
  TORCH_CHECK_TYPE(false, o.name, " is a runtime scalar of the epilogue: pass a Python number, got ", value.tagKind());
}

// A tensor operand's type, rank, dtype and device: what holds whatever the sizes (the Meta kernels run it too).
inline void check_operand_static(const OperandSpec& o, const at::Tensor& t, const at::Tensor& A) {
  TORCH_CHECK_TYPE(t.defined(), o.name, " must be a torch.Tensor of shape ", operand_shape(o), ", got NoneType");
  if (o.kind == OperandKind::ScalarTensor) {
    TORCH_CHECK_VALUE(t.dim() <= 1, scalar_tensor_message(o, tuple_str(t.sym_sizes())));
  } else {
    const int64_t rank = o.kind == OperandKind::Row || o.kind == OperandKind::Col ? 1 : 2;
    TORCH_CHECK_VALUE(t.dim() == rank, o.name, " must be ", rank, "-D ", operand_shape(o), "; got shape ",
                      tuple_str(t.sym_sizes()));
  }
  if (t.scalar_type() != o.dtype) {
    const c10::ScalarType got = t.scalar_type();
    TORCH_CHECK_TYPE(false, o.name, " is ", torch_dtype(got), "; this plan's epilogue reads it as ", o.dtype_name,
                     ": pass ", o.name, ".to(", torch_dtype(o.dtype), ")",
                     dtype_declarable(o, got) ? " or declare it with dtype='" + dtype_name(got) + "'" : std::string());
  }
  TORCH_CHECK_VALUE(t.device() == A.device(), o.name, " is on ", t.device().str(), " but A and B on ",
                    A.device().str(), ": pass ", o.name, ".to('", A.device().str(), "')");
}

// The static checks of every operand on the stack (values: the first operand's); scalars are floats by schema.
inline void check_operands_static(const OpSpec& op, const c10::IValue* values, const at::Tensor& A) {
  for (int i = 0; i < op.num_operands; ++i) {
    if (op.operands[i].kind != OperandKind::Scalar) check_operand_static(op.operands[i], tensor_value(values[i]), A);
  }
}

// A batched call (3-D A or B) gives every problem the same epilogue operands (common/gemm_args.h): scalars,
// one-element scales and vectors serve them all, but a matrix operand or per-block scales are one problem's, and
// the second output (aux, or a quantized D's scales) has no batch stride. Refused before any operand's own check, in
// the operands' order, then the second output (generator/runtime/operands.py: check_batchable).
inline void check_batched_epilogue(const OpSpec& op) {
  static constexpr const char kPerProblem[] = "call the op once per problem with 2-D tensors";
  for (int i = 0; i < op.num_operands; ++i) {
    const OperandSpec& o = op.operands[i];
    TORCH_CHECK_VALUE(o.kind != OperandKind::Matrix, "a batched call (3-D A or B) takes no matrix operand '", o.name,
                      "': ", kPerProblem, ", or plan without it");
    TORCH_CHECK_VALUE(!is_block_scales(o), "a batched call (3-D A or B) takes no per-block scales '", o.name, "': ",
                      kPerProblem, ", or plan with scale='tensor' or scale='row'");
  }
  TORCH_CHECK_VALUE(!op.aux, "a batched call (3-D A or B) cannot store the plan's second output (",
                    second_output_name(op), "): ", kPerProblem, ", or plan without it");
}

// Per-block scales' shape for an m x n x k call and row-major storage; returns their leading dimension.
inline int64_t check_block_scales(const OperandSpec& o, const at::Tensor& t, int64_t m, int64_t n, int64_t k) {
  const bool of_a = o.kind == OperandKind::RowBlocks;
  const std::vector<int64_t> wanted = {of_a ? m : scale_blocks(n), scale_blocks(k)};
  TORCH_CHECK_VALUE(t.size(0) == wanted[0] && t.size(1) == wanted[1], o.name, " has shape ", tuple_str(t.sizes()),
                    "; per-block scales of ", of_a ? "A" : "B", " are ", operand_shape(o), " = ", tuple_str(wanted),
                    " for this call");
  const int64_t ld = leading_dim(t, true);
  TORCH_CHECK_VALUE(ld >= 0, o.name, " has strides ", tuple_str(t.strides()), " (", order_str(t),
                    "); the kernel reads per-block scales row-major: pass ", o.name, ".contiguous()");
  return ld;
}

// A per-row (Row) or per-column (Col) vector operand after check_operand_static: `length` values (M or N),
// contiguous.
inline void check_vector(const OperandSpec& o, const at::Tensor& t, int64_t length) {
  const bool row = o.kind == OperandKind::Row;
  TORCH_CHECK_VALUE(t.size(0) == length, o.name, " has length ", t.size(0), "; a per-", row ? "row" : "col",
                    " vector has one value per ", row ? "row" : "column", " of D: length ",
                    row ? "M (A's rows)" : "N (B's columns)", " = ", length);
  TORCH_CHECK_VALUE(length <= 1 || t.stride(0) == 1, o.name, " has stride ", t.stride(0),
                    "; the kernel reads vectors contiguous: pass ", o.name, ".contiguous()");
}

// Checks every operand for a launch of an m x n x k GEMM and fills its slot of args, in the operands' order.
inline void check_epilogue_operands(const OpSpec& op, const c10::IValue* values, const at::Tensor& A, int64_t m,
                                    int64_t n, int64_t k, GemmArgs& args) {
  for (int i = 0; i < op.num_operands; ++i) {
    const OperandSpec& o = op.operands[i];
    if (o.kind == OperandKind::Scalar) {
      args.ep_scalar[i] = scalar_value(o, values[i]);
      continue;
    }
    const at::Tensor& t = tensor_value(values[i]);
    check_operand_static(o, t, A);
    if (o.kind == OperandKind::ScalarTensor) {  // any strides: the kernel reads its one element
      TORCH_CHECK_VALUE(t.numel() == 1, scalar_tensor_message(o, tuple_str(t.sizes())));
      args.ep_ptr[i] = t.data_ptr();
      continue;
    }
    if (is_block_scales(o)) {
      args.ep_ld[i] = check_block_scales(o, t, m, n, k);
      args.ep_ptr[i] = t.data_ptr();
      continue;
    }
    if (o.kind != OperandKind::Matrix) {
      check_vector(o, t, o.kind == OperandKind::Row ? m : n);
      args.ep_ptr[i] = t.data_ptr();
      continue;
    }
    TORCH_CHECK_VALUE(t.size(0) == m && t.size(1) == n, o.name, " has shape ", tuple_str(t.sizes()),
                      "; it is an M x N operand of D: (", m, ", ", n, ")");
    const int64_t ld = leading_dim(t, o.row);
    if (ld < 0) {
      // The other order is a fix only for a matrix stored in it (not for one in neither order).
      const bool declarable = leading_dim(t, !o.row) >= 0;
      TORCH_CHECK_VALUE(false, o.name, " has strides ", tuple_str(t.strides()), " (", order_str(t),
                        "); this plan reads it ", o.row ? "row" : "col", "-major: pass ", o.name,
                        o.row ? ".contiguous()" : ".t().contiguous().t()",
                        declarable ? std::string(" or declare it ep.Matrix(order='") + (o.row ? "col" : "row") + "')"
                                   : std::string());
    }
    args.ep_ptr[i] = t.data_ptr();
    args.ep_ld[i] = ld;
  }
}

// -- out= aliasing (generator/runtime/operands.py: check_out_aliasing) --------------------------------

// The bytes [first, last + 1) that t's elements lie in (torch strides are never negative).
inline std::pair<uintptr_t, uintptr_t> byte_span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto first = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {first, first + static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(t.element_size()))};
}

// By address range, not by storage (as the Python check): non-overlapping slices of one buffer are fine.
inline bool overlaps(const at::Tensor& t, const at::Tensor& out) {
  if (t.numel() == 0 || out.numel() == 0 || t.device() != out.device()) return false;
  const auto [first, end] = byte_span(t);
  const auto [out_first, out_end] = byte_span(out);
  return first < out_end && out_first < end;
}

// out may be a matrix operand itself (D += A @ B in place: each element of the operand is read by the thread
// that writes the same element of D, before it writes it); any other overlap is refused. values: the
// operands on the stack (none for a plain op).
inline void check_out_aliasing(const OpSpec& op, const c10::IValue* values, const at::Tensor& out,
                               const at::Tensor& A, const at::Tensor& B) {
  for (const auto& [what, t] : {std::pair<const char*, const at::Tensor*>{"A", &A}, {"B", &B}}) {
    TORCH_CHECK_VALUE(!overlaps(*t, out), "out shares memory with ", what, ": the kernel reads ", what,
                      " while it writes D; pass a separate out");
  }
  for (int i = 0; i < op.num_operands; ++i) {
    const OperandSpec& o = op.operands[i];
    if (o.kind == OperandKind::Scalar) continue;
    const at::Tensor& t = tensor_value(values[i]);
    if (!overlaps(t, out)) continue;
    const bool same = o.kind == OperandKind::Matrix && t.data_ptr() == out.data_ptr() &&
                      t.strides().equals(out.strides()) && t.scalar_type() == out.scalar_type() && o.row == op.d_row;
    TORCH_CHECK_VALUE(same, "out shares memory with ", o.name, " without being the same tensor: each element of D "
                      "may overwrite an element of ", o.name, " that another thread still reads; pass out=", o.name,
                      " itself (same strides and dtype) or a separate out");
  }
}

// The kernel was planned for op.arch (its shared memory and instructions); refuse an older GPU plainly.
inline void check_arch(const OpSpec& op, const c10::Device& device) {
  if (!on_cuda(op)) return;  // a CPU stand-in (gemmgen's tests)
  static std::atomic<int> known[kMaxDevices] = {};
  const int index = device.index();
  int cc = index >= 0 && index < kMaxDevices ? known[index].load(std::memory_order_relaxed) : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index);
    TORCH_CHECK(err == cudaSuccess, op.op, ": cannot query ", device.str(), " (CUDA error ", static_cast<int>(err),
                ": ", cudaGetErrorString(err), ")");
    cc = major * 10 + minor;
    if (index >= 0 && index < kMaxDevices) known[index].store(cc, std::memory_order_relaxed);
  }
  TORCH_CHECK(cc >= op.arch, op.kernel, " was planned for sm_", op.arch, " but ", device.str(), " is sm_", cc,
              ": plan with arch=", cc, " for this GPU");
}

// -- implementations ---------------------------------------------------------------------------------

// The device a launch makes current (none for a CPU stand-in).
inline std::optional<c10::Device> launch_device(const OpSpec& op, const at::Tensor& A) {
  return on_cuda(op) ? std::optional<c10::Device>(A.device()) : std::nullopt;
}

// The bucket of a bucketed op that takes a call (num_buckets: the op's own kernel), chosen as bucket_index does in
// Python (generator/runtime/buckets.py): the first whose bound is at least the call's rows.
inline int bucket_of(const OpSpec& op, const GemmArgs& args) {
  if (op.num_buckets == 0 || args.group_ends != nullptr || args.list != nullptr) return op.num_buckets;
  const int64_t rows = args.m * (args.batch > 0 ? args.batch : 1);
  int bucket = 0;
  while (bucket < op.num_buckets && rows > op.bucket_rows[bucket]) ++bucket;
  return bucket;
}

// Calls the library's launch with args on the device's current stream; a failure's code as the library words it.
inline void call_launch(const OpSpec& op, const c10::Device& device, GemmArgs& args) {
  void* stream = on_cuda(op) ? c10::cuda::getCurrentCUDAStream(device.index()).stream() : nullptr;
  const int bucket = bucket_of(op, args);
  const bool own = bucket == op.num_buckets;
  const int code = (own ? op.launch : op.bucket_launch[bucket])(&args, stream);
  TORCH_CHECK(code == 0, own ? op.kernel : op.bucket_kernel[bucket], ": launch failed: ",
              (own ? op.error_string : op.bucket_error_string[bucket])(code));
}

// Launches with args filled but for A, B, D, the sizes and the batch; aux, when given, is the second output, amax
// the third (zeroed_amax). ldd and batch_stride_d: D's (check_out's, or of D as empty_d allocates it).
inline void launch(const OpSpec& op, const at::Tensor& A, const at::Tensor& B, at::Tensor& D, const Problem& p,
                   int64_t ldd, int64_t batch_stride_d, GemmArgs& args, at::Tensor* aux = nullptr,
                   at::Tensor* amax = nullptr) {
  check_arch(op, A.device());
  if (D.numel() == 0) return;  // M = 0, N = 0 or no problem; K = 0 launches: the kernel writes epilogue(0)
  args.a = A.data_ptr();
  args.b = B.data_ptr();
  args.d = D.data_ptr();
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.lda = p.lda;
  args.ldb = p.ldb;
  args.ldd = ldd;
  if (p.batched) {  // a 2-D call leaves them 0: one problem, the launch of before batching
    args.batch = p.batch;
    args.batch_stride_a = p.batch_stride_a;
    args.batch_stride_b = p.batch_stride_b;
    args.batch_stride_d = batch_stride_d;
  }
  if (aux != nullptr) {
    args.aux = aux->data_ptr();
    args.ldaux = leading_dim(*aux, op.d_row);
  }
  if (amax != nullptr) args.amax = amax->data_ptr<float>();
  call_launch(op, A.device(), args);
}

inline at::Tensor gemm(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  const Problem p = check_operands(op, A, B);
  const c10::cuda::OptionalCUDAGuard guard(launch_device(op, A));
  at::Tensor D = empty_d(op, A, B);
  GemmArgs args{};
  launch(op, A, B, D, p, leading_dim(D, op.d_row), batch_stride(D), args);
  return D;
}

inline at::Tensor& gemm_out(const OpSpec& op, const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  const Problem p = check_operands(op, A, B);
  const auto [ldd, batch_stride_d] = check_out(op, out, A, B);
  check_out_aliasing(op, nullptr, out, A, B);
  const c10::cuda::OptionalCUDAGuard guard(launch_device(op, A));
  GemmArgs args{};
  launch(op, A, B, out, p, ldd, batch_stride_d, args);
  return out;
}

// Meta (fake) tensors: the result's shape, dtype and strides, for torch.compile and shape inference.
inline at::Tensor gemm_meta(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  check_rank_and_dtype(op, A, "A");
  check_rank_and_dtype(op, B, "B");
  check_k(A, B);
  return empty_d(op, A, B);  // (a batched call's batch sizes checked there)
}

inline at::Tensor& gemm_out_meta(const OpSpec& op, const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  gemm_meta(op, A, B);
  check_out_shape_and_dtype(op, out, A, B);
  return out;
}

// .out under FakeTensor and functionalization (torch.compile, AOTAutograd): torch functionalizes a custom
// op whose return aliases a mutated argument only by decomposing it, so .out also has this
// CompositeImplicitAutograd kernel: the checks, the default overload, a copy into out. Eager calls keep
// the CompositeExplicitAutograd kernel, which writes straight into out (as gemmgen's JIT ops).
inline at::Tensor& gemm_out_decomposition(const OpSpec& op, const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  check_rank_and_dtype(op, A, "A");
  check_rank_and_dtype(op, B, "B");
  check_k(A, B);
  check_out_shape_and_dtype(op, out, A, B);
  // looked up per call: this kernel runs while tracing, not in eager calls
  const auto default_op = c10::Dispatcher::singleton()
                              .findSchemaOrThrow((std::string(op.ns) + "::" + op.op).c_str(), "")
                              .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return out.copy_(default_op.call(A, B));
}

// -- grouped calls: a mixture of experts' rows (generator/runtime/op.py: GemmOp.run_grouped) ----------------------
//
// A (total_M, K) holds every group's rows, sorted by group; offsets (E,) int32 the groups' ends (cumulative row
// counts: group g is rows [offsets[g - 1], offsets[g]) of A and D, group 0 from row 0); B (E, K, N) one matrix per
// group, each in the plan's order; D (total_M, N) in the plan's order, D[rows of g] = A[rows of g] @ B[g]. One
// launch (GemmArgs' group_ends) on the sm90 family's persistent kernels: other plans (OpSpec::grouped_refusal) and
// operands off the 16-byte rule are refused here, before any launch, rather than by the library's error code.

// The plan first, before any other check (the Meta impl too): no operand makes such a plan take the call.
inline void refuse_grouped_plan(const OpSpec& op) {
  TORCH_CHECK_VALUE(op.grouped_refusal == nullptr, op.op, ": ", op.grouped_refusal);
}

// A list call's (and a grouped call along K's), likewise.
inline void refuse_grouped_list_plan(const OpSpec& op) {
  TORCH_CHECK_VALUE(op.grouped_list_refusal == nullptr, op.op, ": ", op.grouped_list_refusal);
}

inline void check_grouped_k(const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK_VALUE(A.sym_size(1).sym_eq(B.sym_size(1)).expect_true(__FILE__, __LINE__), "A is ",
                    tuple_str(A.sym_sizes()), " and B is ", tuple_str(B.sym_sizes()),
                    ": K must agree (A's columns = the rows of B's matrices); for experts' weights W (E, N, K) pass "
                    "B = W.transpose(1, 2)");
}

inline std::string offsets_count_message(const at::Tensor& offsets, const at::Tensor& B) {
  return "offsets has " + size_str(offsets.sym_size(0)) + " group ends but B has " + size_str(B.sym_size(0)) +
         " matrices (B.size(0)): pass one end per group";
}

// offsets: what holds whatever the sizes (the Meta impl runs it too).
inline void check_offsets_static(const at::Tensor& offsets, const at::Tensor& A) {
  TORCH_CHECK_TYPE(offsets.defined(), "offsets must be a torch.Tensor, got NoneType");
  TORCH_CHECK_TYPE(offsets.scalar_type() == c10::ScalarType::Int, "offsets is ", torch_dtype(offsets.scalar_type()),
                   "; group ends are int32: pass offsets.to(torch.int32)");
  TORCH_CHECK_VALUE(offsets.dim() == 1,
                    "offsets must be 1-D (E,), the groups' ends (cumulative row counts); got shape ",
                    tuple_str(offsets.sym_sizes()));
  TORCH_CHECK_VALUE(offsets.device() == A.device(), "offsets is on ", offsets.device().str(), " but A and B on ",
                    A.device().str(), ": pass offsets.to('", A.device().str(), "')");
}

inline void check_offsets_contiguous(const at::Tensor& offsets) {
  TORCH_CHECK_VALUE(offsets.size(0) <= 1 || offsets.stride(0) == 1, "offsets has stride ", offsets.stride(0),
                    "; the kernel reads group ends contiguous: pass offsets.contiguous()");
}

// A grouped call's problem from its checked A (2-D, every group's rows) and B (3-D).
inline Problem grouped_problem(const at::Tensor& A, const at::Tensor& B, int64_t lda, int64_t ldb) {
  const int64_t m = A.size(0), n = B.size(2), k = A.size(1), groups = B.size(0);
  TORCH_CHECK_VALUE(groups > 0 || m == 0, "B has no matrices (E = 0) but A has ", m,
                    " rows: with no groups, A must have no rows");
  check_sizes(m, n, k);
  return Problem{m, n, k, lda, ldb, /*batched=*/true, groups, 0, batch_stride(B)};
}

// A (2-D), B (3-D) and offsets of a grouped call, but for the offsets' values; returns its problem: total_M x N x K,
// the groups as the batch (E), B's stride between its matrices (0 for one), A's 0.
inline Problem check_grouped_operands(const OpSpec& op, const at::Tensor& A, const at::Tensor& B,
                                      const at::Tensor& offsets) {
  const int64_t lda = check_operand(op, A, "A", op.a_row, CallForm::grouped);
  const int64_t ldb = check_operand(op, B, "B", op.b_row, CallForm::grouped);
  check_same_device(A, B);
  check_grouped_k(A, B);
  check_offsets_static(offsets, A);
  TORCH_CHECK_VALUE(offsets.size(0) == B.size(0), offsets_count_message(offsets, B));
  check_offsets_contiguous(offsets);
  return grouped_problem(A, B, lda, ldb);
}

// The 16-byte rule of the grouped kernel's TMA loads (the library's choose_grouped_path, common/launch.cuh).
inline constexpr int64_t kTmaAlignBytes = 16;

// A copy of a grouped call's A (2-D) or B (3-D) in its order at a fresh, 16-byte aligned address.
inline std::string aligned_copy(const char* what, bool row, int64_t dim) {
  const std::string fresh = ".clone(memory_format=torch.contiguous_format)";
  if (row) return what + fresh;
  const std::string swap = dim == 2 ? ".t()" : ".transpose(1, 2)";
  return what + swap + fresh + swap;
}

// A view of a padded buffer holding t (A (M, K) or B (E, K, N)) in its order, whose leading dimension is a multiple
// of `multiple` elements.
inline std::string padded_view(const at::Tensor& t, bool row, int64_t multiple) {
  const auto up = [multiple](int64_t size) {
    return std::to_string((std::max<int64_t>(size, 1) + multiple - 1) / multiple * multiple);
  };
  const std::string like = "dtype=" + torch_dtype(t.scalar_type()) + ", device='" + t.device().str() + "'";
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const std::string batch = t.dim() == 3 ? std::to_string(t.size(0)) + ", " : "";
  const std::string lead = t.dim() == 3 ? ":, " : "";
  if (row) {
    return "torch.empty(" + batch + std::to_string(rows) + ", " + up(cols) + ", " + like + ")[" + lead + ":, :" +
           std::to_string(cols) + "]";
  }
  return "torch.empty(" + batch + std::to_string(cols) + ", " + up(rows) + ", " + like + ")[" + lead + ":, :" +
         std::to_string(rows) + "]" + (t.dim() == 2 ? ".t()" : ".transpose(1, 2)");
}

// A grouped call's A or B on the 16-byte rule (base address, leading dimension, B's stride between its matrices:
// stride 0 for A and a B of one matrix), or refused with the fix (generator/runtime/checks.py's
// grouped_alignment_refusal).
inline void check_grouped_alignment(const char* what, const at::Tensor& t, bool row, int64_t ld, int64_t stride) {
  const int64_t size = static_cast<int64_t>(t.element_size());
  const auto address = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) % kTmaAlignBytes);
  std::string detail, fix;
  if (address != 0) {
    detail = "its base address is " + std::to_string(address) + " bytes past a multiple of 16";
    fix = "pass a copy, " + aligned_copy(what, row, t.dim());
  } else if (ld * size % kTmaAlignBytes != 0) {
    const int64_t multiple = kTmaAlignBytes / size;
    detail = "its leading dimension is " + std::to_string(ld) + " elements (" + std::to_string(ld * size) + " bytes)";
    fix = "make its leading dimension a multiple of " + std::to_string(multiple) +
          " elements: pass a view of a padded buffer, e.g. " + padded_view(t, row, multiple);
  } else if (stride * size % kTmaAlignBytes != 0) {
    detail = "its matrices are " + std::to_string(stride) + " elements (" + std::to_string(stride * size) +
             " bytes) apart";
    fix = "pass a copy, " + aligned_copy(what, row, t.dim());
  } else {
    return;
  }
  TORCH_CHECK_VALUE(false, what, " breaks the 16-byte rule of grouped calls: ", detail,
                    "; the grouped kernel loads A and B by TMA, which needs the base address, the leading dimension "
                    "and the stride between B's matrices to be multiples of 16 bytes: ", fix);
}

// The offsets' values, with one copy to the host: nondecreasing group ends from 0, the last at A's last row (along_k:
// at K, A's last column).
inline void check_group_ends(const at::Tensor& offsets, int64_t rows, bool along_k = false) {
  const at::Tensor ends = offsets.to(at::kCPU);  // (itself for CPU tensors: gemmgen's stand-in tests)
  const int32_t* values = ends.data_ptr<int32_t>();  // contiguous: checked, or at most one end
  int64_t previous = 0;
  for (int64_t g = 0; g < ends.numel(); ++g) {
    const int64_t end = values[g];
    if (end < previous) {
      TORCH_CHECK_VALUE(g != 0,
                        "offsets must be nondecreasing group ends (cumulative row counts) from 0: offsets[0] = ", end,
                        " < 0");
      TORCH_CHECK_VALUE(false, "offsets must be nondecreasing group ends (cumulative row counts): offsets[", g, "] = ",
                        end, " < offsets[", g - 1, "] = ", previous);
    }
    previous = end;
  }
  if (along_k) {
    TORCH_CHECK_VALUE(ends.numel() == 0 || previous == rows, "offsets[-1] = ", previous, " but K is ", rows,
                      " (A's columns, B's rows): the last group must end at K");
    return;
  }
  TORCH_CHECK_VALUE(ends.numel() == 0 || previous == rows, "offsets[-1] = ", previous, " but A has ", rows,
                    " rows: the last group must end at A's last row");
}

// The offsets whose values this thread checked last, held weakly: a grouped call on the same live tensor, unchanged
// since (its version counter, autograd's own guard against in-place writes) and of the same total, skips the copy to
// the host, a sync. The backward's grouped calls take the offsets autograd saved from the forward, so a training step
// reads them on the host once per forward call rather than once per call. A tensor freed since cannot match: the weak
// reference has expired. (Inference tensors keep no version counter: always checked.)
struct CheckedOffsets {
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> tensor;
  int64_t version = 0, total = 0;
};

inline bool offsets_checked_before(const CheckedOffsets& last, const at::Tensor& offsets, int64_t total) {
  if (!last.tensor || offsets.is_inference() || last.total != total) return false;
  const auto held = last.tensor->lock();
  return held.get() == offsets.unsafeGetTensorImpl() && last.version == offsets._version();
}

// check_group_ends, skipped for the offsets this thread checked last (unchanged since, the same total).
inline void check_group_ends_once(const at::Tensor& offsets, int64_t total, bool along_k = false) {
  thread_local CheckedOffsets last;
  if (offsets_checked_before(last, offsets, total)) return;
  check_group_ends(offsets, total, along_k);
  if (!offsets.is_inference()) {
    last = CheckedOffsets{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(offsets.getIntrusivePtr()),
                          offsets._version(), total};
  }
}

// Whether the current stream (of the device made current) is being captured into a CUDA graph: the offsets' values
// are not checked then (a copy to the host, which a capture cannot hold); the kernel clamps ends out of order or past
// A's rows, so its memory accesses stay in bounds.
inline bool stream_capturing(const OpSpec& op) {
  return on_cuda(op) && c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

// An m x n D in the plan's order (sizes may be symbolic: shared with the Meta impls), on the device of options.
inline at::Tensor empty_matrix(const OpSpec& op, const c10::SymInt& m, const c10::SymInt& n,
                               const at::TensorOptions& options) {
  if (op.d_row) return at::empty_symint({m, n}, options.dtype(op.out_dtype));
  return at::empty_symint({n, m}, options.dtype(op.out_dtype)).t();
}

// -- grouped calls along K (generator/runtime/op.py: GemmOp.run_grouped_k) ----------------------------------------
//
// A (M, K) and B (K, N), one matrix each, and offsets (E,) int32 splitting K: group g is the K values [offsets[g - 1],
// offsets[g]) (group 0 from 0), and D (E, M, N) holds D[g] = A[:, group g] @ B[group g, :], zeros for an empty group:
// torch._grouped_mm's 2-D x 2-D form, the weight gradient of grouped rows. The plans that take list calls take it:
// the library makes each group a listed problem, its tensor maps built on the device (GemmArgs::groups_along_k).

// A and B of a grouped call along K: K agrees.
inline void check_k_grouped_k(const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK_VALUE(A.sym_size(1).sym_eq(B.sym_size(0)).expect_true(__FILE__, __LINE__), "A is ",
                    tuple_str(A.sym_sizes()), " and B is ", tuple_str(B.sym_sizes()),
                    ": K must agree (A's columns = B's rows), the dimension offsets splits");
}

// The checks that need no data (the Meta impl runs them too).
inline void check_grouped_k_static(const at::Tensor& A, const at::Tensor& B, const at::Tensor& offsets) {
  check_k_grouped_k(A, B);
  check_offsets_static(offsets, A);
}

// A, B and offsets of a grouped call along K, but for the offsets' values; returns its problem: M x N x K, the groups
// as the batch (E), A's and B's strides between matrices 0 (one matrix each).
inline Problem check_grouped_k_operands(const OpSpec& op, const at::Tensor& A, const at::Tensor& B,
                                        const at::Tensor& offsets) {
  const int64_t lda = check_operand(op, A, "A", op.a_row, CallForm::k_grouped);
  const int64_t ldb = check_operand(op, B, "B", op.b_row, CallForm::k_grouped);
  check_same_device(A, B);
  check_grouped_k_static(A, B, offsets);
  check_offsets_contiguous(offsets);
  const int64_t m = A.size(0), n = B.size(1), k = A.size(1), groups = offsets.size(0);
  TORCH_CHECK_VALUE(groups > 0 || k == 0, "offsets has no group ends (E = 0) but K is ", k,
                    ": with no groups, K must be 0");
  check_sizes(m, n, k);
  return Problem{m, n, k, lda, ldb, /*batched=*/true, groups, 0, 0};
}

// D of a grouped call along K: (E, M, N), each matrix in the plan's order.
inline at::Tensor empty_grouped_k_d(const OpSpec& op, const at::Tensor& A, const at::Tensor& B,
                                    const at::Tensor& offsets) {
  const at::TensorOptions options = A.options().dtype(op.out_dtype);
  if (op.d_row) return at::empty_symint({offsets.sym_size(0), A.sym_size(0), B.sym_size(1)}, options);
  return at::empty_symint({offsets.sym_size(0), B.sym_size(1), A.sym_size(0)}, options).transpose(1, 2);
}

// A plan that takes list calls takes a grouped call along K with A column-major and B row-major (K the outer
// dimension of both: a group starts at any k, which a TMA load cannot start at along an operand's contiguous
// dimension); generator/spec/grouped.py's grouped_k_refusal, in its words.
inline void refuse_grouped_k_plan(const OpSpec& op) {
  refuse_grouped_list_plan(op);
  if (!op.a_row && op.b_row) return;
  const std::string which = op.a_row && !op.b_row ? "A is row-major and B is column-major"
                            : op.a_row            ? "A is row-major"
                                                  : "B is column-major";
  TORCH_CHECK_VALUE(false, op.op,
                    ": grouped calls along K take A column-major and B row-major (M and N contiguous): a group may "
                    "start at any k, which a TMA load cannot start at along an operand's contiguous dimension; this "
                    "plan's ",
                    which, ": plan with layout='nt' (for a weight gradient dW = X.t() @ dY: A = X.t(), B = dY)");
}

// The checks in GemmOp.run_grouped_k's order: the plan, A, B and offsets, the 16-byte rule where the call launches,
// the offsets' values (not while a CUDA graph is captured); then the launch.
inline at::Tensor gemm_grouped_k(const OpSpec& op, const at::Tensor& A, const at::Tensor& B,
                                 const at::Tensor& offsets) {
  refuse_grouped_k_plan(op);
  const Problem p = check_grouped_k_operands(op, A, B, offsets);
  if (p.m > 0 && p.n > 0 && p.k > 0) {
    check_grouped_alignment("A", A, op.a_row, p.lda, 0);
    check_grouped_alignment("B", B, op.b_row, p.ldb, 0);
  }
  const c10::cuda::OptionalCUDAGuard guard(launch_device(op, A));
  if (!stream_capturing(op)) check_group_ends_once(offsets, p.k, /*along_k=*/true);
  at::Tensor D = empty_grouped_k_d(op, A, B, offsets);
  if (D.numel() == 0) return D;
  if (p.k == 0) return D.zero_();  // every group is a sum of nothing
  GemmArgs args{};
  args.group_ends = offsets.data_ptr<int32_t>();
  args.groups_along_k = 1;
  launch(op, A, B, D, p, leading_dim(D, op.d_row), D.stride(0), args);
  return D;
}

// D of a grouped call: (total_M, N) in the plan's order.
inline at::Tensor empty_grouped_d(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  return empty_matrix(op, A.sym_size(0), B.sym_size(-1), A.options());
}

// -- fp8 grouped calls with scales (.grouped_scaled, .masked_scaled; GemmOp.run_grouped_scaled) ---------------------
//
// A plan with scale='block' (DeepSeek's scales) takes grouped calls of rows with its two scales: scale_a, one per row
// of A and 128-wide K block, (rows of A, ceil(K/128)) over every group's rows (what quantize(x, scale='block') gives
// for the concatenated rows), and scale_b, one matrix of 128 x 128 block scales per group's B, (E, ceil(N/128),
// ceil(K/128)), contiguous: the kernel reads group g's at scale_b + g * ceil(N/128) * ceil(K/128) (sm90
// Kernel::block_scales). The masked form's scale_a is (E, max_m, ceil(K/128)), its slabs one matrix as A's.
// A plan with scale='row' (torch._scaled_grouped_mm's rowwise form) takes scale_a (rows of A,) and scale_b (E, N),
// group g's vector read at scale_b + g * N by the epilogue (check_grouped_row_scales, Epilogue::kColsPerGroup);
// masked: scale_a (E, max_m).

// A scaled grouped call's scales: the op's two operand slots (scale_a's rows, scale_b's matrices of blocks).
struct GroupedScales {
  const at::Tensor& a;
  const at::Tensor& b;
};

// A scaled grouped call's scale_b after its shape, in either scale mode: its dtype, its device and one group's scales
// after another's.
inline void check_grouped_scale_b_storage(const OperandSpec& ob, const at::Tensor& b, const at::Tensor& A) {
  TORCH_CHECK_TYPE(b.scalar_type() == ob.dtype, ob.name, " is ", torch_dtype(b.scalar_type()),
                   "; this plan's epilogue reads it as ", ob.dtype_name, ": pass ", ob.name, ".to(",
                   torch_dtype(ob.dtype), ")");
  TORCH_CHECK_VALUE(b.device() == A.device(), ob.name, " is on ", b.device().str(), " but A and B on ",
                    A.device().str(), ": pass ", ob.name, ".to('", A.device().str(), "')");
  TORCH_CHECK_VALUE(b.is_contiguous(), ob.name, " has strides ", tuple_str(b.strides()),
                    "; the kernel reads each group's scales of B back to back: pass ", ob.name, ".contiguous()");
}

// Whether the op's scaled grouped calls take per-row scales (scale='row': scale_a (rows,), scale_b (E, N)), else
// per-block ones (scale='block').
inline bool row_scaled(const OpSpec& op) {
  return op.num_operands == 2 && op.operands[0].kind == OperandKind::Row && op.operands[1].kind == OperandKind::Col;
}

// scale='row': scale_a one value per row of A (every group's rows), scale_b one vector of N per group, (E, N),
// contiguous: the kernel reads group g's at scale_b + g * N (Epilogue::kColsPerGroup).
inline void check_grouped_row_scales(const OpSpec& op, const GroupedScales& scales, const at::Tensor& A, int64_t rows,
                                     int64_t groups, int64_t n, GemmArgs& args) {
  const OperandSpec& oa = op.operands[0];
  const OperandSpec& ob = op.operands[1];
  check_operand_static(oa, scales.a, A);
  check_vector(oa, scales.a, rows);
  args.ep_ptr[0] = scales.a.data_ptr();
  TORCH_CHECK_TYPE(scales.b.defined(), ob.name, " must be a torch.Tensor of shape (E, N), got NoneType");
  const std::vector<int64_t> wanted = {groups, n};
  TORCH_CHECK_VALUE(scales.b.dim() == 2 && scales.b.sizes() == at::IntArrayRef(wanted), ob.name, " has shape ",
                    tuple_str(scales.b.sym_sizes()), "; a grouped call's per-column scales of B are one vector of N "
                    "per group: (E, N) = ", tuple_str(wanted), " (torch.stack of each expert's quantize(W[e], "
                    "scale='row') scales)");
  check_grouped_scale_b_storage(ob, scales.b, A);
  args.ep_ptr[1] = scales.b.data_ptr();
}

// scale_a and scale_b of a grouped call of `rows` rows, `groups` groups, N and K: type, dtype, device and shape;
// fills their slots of args.
inline void check_grouped_scales(const OpSpec& op, const GroupedScales& scales, const at::Tensor& A, int64_t rows,
                                 int64_t groups, int64_t n, int64_t k, GemmArgs& args) {
  if (row_scaled(op)) return check_grouped_row_scales(op, scales, A, rows, groups, n, args);
  TORCH_CHECK(op.num_operands == 2 && op.operands[0].kind == OperandKind::RowBlocks &&
                  op.operands[1].kind == OperandKind::ColBlocks,
              op.op, ": a scaled grouped call needs a plan whose only operands are per-block or per-row scales");
  const OperandSpec& oa = op.operands[0];
  const OperandSpec& ob = op.operands[1];
  check_operand_static(oa, scales.a, A);
  args.ep_ld[0] = check_block_scales(oa, scales.a, rows, n, k);
  args.ep_ptr[0] = scales.a.data_ptr();
  TORCH_CHECK_TYPE(scales.b.defined(), ob.name, " must be a torch.Tensor of shape (E, ceil(N/128), ceil(K/128)), got "
                   "NoneType");
  const std::vector<int64_t> wanted = {groups, scale_blocks(n), scale_blocks(k)};
  TORCH_CHECK_VALUE(scales.b.dim() == 3 && scales.b.sizes() == at::IntArrayRef(wanted), ob.name, " has shape ",
                    tuple_str(scales.b.sym_sizes()), "; a grouped call's per-block scales of B are one (ceil(N/128), "
                    "ceil(K/128)) matrix per group: (E, ceil(N/128), ceil(K/128)) = ", tuple_str(wanted),
                    " (torch.stack of each expert's quantize(W[e], scale='block', block=(128, 128)) scales)");
  check_grouped_scale_b_storage(ob, scales.b, A);
  args.ep_ld[1] = wanted[2];
  args.ep_ptr[1] = scales.b.data_ptr();
}

// The checks in GemmOp.run_grouped's order: the plan, A, B and offsets (and a scaled call's scales), the 16-byte rule
// where the call launches, the offsets' values; then the launch.
inline at::Tensor gemm_grouped(const OpSpec& op, const at::Tensor& A, const at::Tensor& B, const at::Tensor& offsets,
                               const GroupedScales* scales = nullptr) {
  if (B.defined() && B.dim() == 2 && scales == nullptr) return gemm_grouped_k(op, A, B, offsets);
  refuse_grouped_plan(op);
  const Problem p = check_grouped_operands(op, A, B, offsets);
  GemmArgs args{};
  if (scales != nullptr) check_grouped_scales(op, *scales, A, p.m, B.size(0), p.n, p.k, args);
  if (p.m > 0 && p.n > 0 && p.k > 0) {
    check_grouped_alignment("A", A, op.a_row, p.lda, 0);
    check_grouped_alignment("B", B, op.b_row, p.ldb, p.batch_stride_b);
  }
  const c10::cuda::OptionalCUDAGuard guard(launch_device(op, A));
  if (!stream_capturing(op)) check_group_ends_once(offsets, p.m);
  at::Tensor D = empty_grouped_d(op, A, B);
  if (D.numel() == 0) return D;
  if (p.k == 0) return D.zero_();  // every row of every group is a sum of nothing (the kernels need a k tile)
  args.group_ends = offsets.data_ptr<int32_t>();
  launch(op, A, B, D, p, leading_dim(D, op.d_row), /*batch_stride_d=*/0, args);
  return D;
}

// Meta tensors: D's shape, dtype and strides after the checks that need no data (no size depends on the offsets'
// values).
inline at::Tensor gemm_grouped_meta(const OpSpec& op, const at::Tensor& A, const at::Tensor& B,
                                    const at::Tensor& offsets) {
  if (B.defined() && B.dim() == 2) {
    refuse_grouped_k_plan(op);
    check_rank_and_dtype(op, A, "A", CallForm::k_grouped);
    check_rank_and_dtype(op, B, "B", CallForm::k_grouped);
    check_grouped_k_static(A, B, offsets);
    return empty_grouped_k_d(op, A, B, offsets);
  }
  refuse_grouped_plan(op);
  check_rank_and_dtype(op, A, "A", CallForm::grouped);
  check_rank_and_dtype(op, B, "B", CallForm::grouped);
  check_grouped_k(A, B);
  check_offsets_static(offsets, A);
  TORCH_CHECK_VALUE(offsets.sym_size(0).sym_eq(B.sym_size(0)).expect_true(__FILE__, __LINE__),
                    offsets_count_message(offsets, B));
  return empty_grouped_d(op, A, B);
}

// -- grouped calls, the masked form (DeepGEMM's masked layout; generator/runtime/op.py: GemmOp.run_masked) --------
//
// A (E, max_m, K) holds each group's rows in a slab of its own, the slabs back to back, the first counts[g] rows of
// slab g valid; counts (E,) int32; B (E, K, N) as for a grouped call; D (E, max_m, N), the rows of a slab past its
// count not written. One launch of the grouped kernel over A's slabs as one (E * max_m, K) matrix, GemmArgs'
// group_ends the counts and group_rows max_m.

// Ranks, the same E and K.
inline void check_masked_shapes(const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK_VALUE(A.dim() == 3, "A has shape ", tuple_str(A.sym_sizes()),
                    "; a masked call takes A 3-D (E, max_m, K): each group's rows in a slab of max_m rows, the first "
                    "counts[g] of them valid");
  TORCH_CHECK_VALUE(B.dim() == 3,
                    "B must be 3-D (E, K, N) for a grouped call: one matrix per group (expert); got shape ",
                    tuple_str(B.sym_sizes()));
  TORCH_CHECK_VALUE(A.sym_size(0).sym_eq(B.sym_size(0)).expect_true(__FILE__, __LINE__), "A has ",
                    size_str(A.sym_size(0)), " slabs (A.size(0)) but B has ", size_str(B.sym_size(0)),
                    " matrices: pass one slab of rows per group");
  TORCH_CHECK_VALUE(A.sym_size(2).sym_eq(B.sym_size(1)).expect_true(__FILE__, __LINE__), "A is ",
                    tuple_str(A.sym_sizes()), " and B is ", tuple_str(B.sym_sizes()),
                    ": K must agree (A's columns = the rows of B's matrices); for experts' weights W (E, N, K) pass "
                    "B = W.transpose(1, 2)");
}

// counts: what holds whatever the sizes.
inline void check_counts_static(const at::Tensor& counts, const at::Tensor& A) {
  TORCH_CHECK_TYPE(counts.defined(), "counts must be a torch.Tensor, got NoneType");
  TORCH_CHECK_TYPE(counts.scalar_type() == c10::ScalarType::Int, "counts is ", torch_dtype(counts.scalar_type()),
                   "; the groups' row counts are int32: pass counts.to(torch.int32)");
  TORCH_CHECK_VALUE(counts.dim() == 1, "counts must be 1-D (E,), each group's valid rows; got shape ",
                    tuple_str(counts.sym_sizes()));
  TORCH_CHECK_VALUE(counts.device() == A.device(), "counts is on ", counts.device().str(), " but A and B on ",
                    A.device().str(), ": pass counts.to('", A.device().str(), "')");
}

// A, B and counts of a masked call but for the counts' values, in GemmOp._check_masked's order; returns the problem
// of A's slabs as one matrix and that matrix (a view of A).
inline std::pair<Problem, at::Tensor> check_masked_operands(const OpSpec& op, const at::Tensor& A, const at::Tensor& B,
                                                            const at::Tensor& counts) {
  TORCH_CHECK_TYPE(A.defined(), "A must be a torch.Tensor, got NoneType");
  TORCH_CHECK_TYPE(B.defined(), "B must be a torch.Tensor, got NoneType");
  check_masked_shapes(A, B);
  const int64_t groups = A.size(0), slab = A.size(1), k = A.size(2);
  TORCH_CHECK_VALUE(groups <= 1 || slab == 0 || k == 0 || A.stride(0) == slab * A.stride(1), "A has strides ",
                    tuple_str(A.strides()), ": the kernel reads A's slabs as one matrix of ", groups, " x ", slab,
                    " rows, so a slab must follow the one before it: pass A.contiguous()");
  const at::Tensor rows = A.reshape({groups * slab, k});  // (a view where the check above holds)
  const int64_t lda = check_operand(op, rows, "A", op.a_row, CallForm::grouped);
  const int64_t ldb = check_operand(op, B, "B", op.b_row, CallForm::grouped);
  check_same_device(rows, B);
  const Problem p = grouped_problem(rows, B, lda, ldb);
  check_counts_static(counts, A);
  TORCH_CHECK_VALUE(counts.size(0) == groups, "counts has ", counts.size(0), " entries but B has ", groups,
                    " matrices (B.size(0)): pass one count per group");
  TORCH_CHECK_VALUE(counts.size(0) <= 1 || counts.stride(0) == 1, "counts has stride ", counts.stride(0),
                    "; the kernel reads the counts contiguous: pass counts.contiguous()");
  return {p, rows};
}

// The counts' values, with one copy to the host: each in [0, max_m].
inline void check_group_counts(const at::Tensor& counts, int64_t slab) {
  const at::Tensor host = counts.to(at::kCPU);  // (itself for CPU tensors: gemmgen's stand-in tests)
  const int32_t* values = host.data_ptr<int32_t>();  // contiguous: checked, or at most one count
  for (int64_t g = 0; g < host.numel(); ++g) {
    TORCH_CHECK_VALUE(values[g] >= 0 && values[g] <= slab, "counts[", g, "] = ", values[g], " is outside [0, ", slab,
                      "]: each count is the number of valid rows at the top of its group's slab of A (E, max_m=",
                      slab, ", K)");
  }
}

// D of a masked call: (E, max_m, N), the slabs of one (E * max_m, N) matrix in the plan's order.
inline at::Tensor empty_masked_d(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  return empty_matrix(op, A.sym_size(0) * A.sym_size(1), B.sym_size(-1), A.options())
      .view_symint({A.sym_size(0), A.sym_size(1), B.sym_size(-1)});
}

// The checks in GemmOp.run_masked's order: the plan, A, B and counts, the 16-byte rule where the call launches, the
// counts' values; then the launch.
inline at::Tensor gemm_masked(const OpSpec& op, const at::Tensor& A, const at::Tensor& B, const at::Tensor& counts,
                              const GroupedScales* scales = nullptr) {
  refuse_grouped_plan(op);
  const auto [p, rows] = check_masked_operands(op, A, B, counts);
  GemmArgs args{};
  if (scales != nullptr) {
    // scale_a's slabs as one matrix (a vector), as A's: (E, max_m, ceil(K/128)) -> (E * max_m, ceil(K/128)), or
    // per row (E, max_m) -> (E * max_m,)
    const at::Tensor& sa = scales->a;
    const bool per_row = row_scaled(op);
    TORCH_CHECK_VALUE(!sa.defined() || (sa.dim() == (per_row ? 2 : 3) && sa.size(0) == A.size(0) &&
                                        sa.size(1) == A.size(1)),
                      "scale_a has shape ", sa.defined() ? tuple_str(sa.sym_sizes()) : std::string("None"),
                      per_row ? "; a masked call's per-row scales of A are (E, max_m), one slab per group as A's"
                              : "; a masked call's per-block scales of A are (E, max_m, ceil(K/128)), one slab per "
                                "group as A's");
    TORCH_CHECK_VALUE(!sa.defined() || sa.is_contiguous(), "scale_a has strides ", tuple_str(sa.strides()),
                      "; the kernel reads its slabs as one matrix: pass scale_a.contiguous()");
    const at::Tensor sa_rows = !sa.defined() ? sa : per_row ? sa.reshape({p.m}) : sa.reshape({p.m, sa.size(2)});
    check_grouped_scales(op, GroupedScales{sa_rows, scales->b}, rows, p.m, A.size(0), p.n, p.k, args);
  }
  if (p.m > 0 && p.n > 0 && p.k > 0) {
    check_grouped_alignment("A", rows, op.a_row, p.lda, 0);
    check_grouped_alignment("B", B, op.b_row, p.ldb, p.batch_stride_b);
  }
  const c10::cuda::OptionalCUDAGuard guard(launch_device(op, A));
  if (!stream_capturing(op)) check_group_counts(counts, A.size(1));
  at::Tensor D = empty_masked_d(op, A, B);
  if (D.numel() == 0) return D;
  if (p.k == 0) return D.zero_();  // every valid row is a sum of nothing (the kernels need a k tile)
  args.group_ends = counts.data_ptr<int32_t>();
  args.group_rows = A.size(1);
  at::Tensor rows_of_d = D.view({p.m, p.n});
  launch(op, rows, B, rows_of_d, p, leading_dim(rows_of_d, op.d_row), /*batch_stride_d=*/0, args);
  return D;
}

// Meta tensors (emitted packages' Meta kernel; the JIT ops' fake is GemmOp._check_masked_meta): D's shape, dtype and
// strides after the checks that need neither data nor concrete sizes, in gemm_masked's words.
inline at::Tensor gemm_masked_meta(const OpSpec& op, const at::Tensor& A, const at::Tensor& B,
                                   const at::Tensor& counts) {
  refuse_grouped_plan(op);
  TORCH_CHECK_TYPE(A.defined(), "A must be a torch.Tensor, got NoneType");
  TORCH_CHECK_TYPE(B.defined(), "B must be a torch.Tensor, got NoneType");
  check_masked_shapes(A, B);
  check_rank_and_dtype(op, A, "A");
  check_rank_and_dtype(op, B, "B");
  check_counts_static(counts, A);
  TORCH_CHECK_VALUE(counts.sym_size(0).sym_eq(B.sym_size(0)).expect_true(__FILE__, __LINE__), "counts has ",
                    size_str(counts.sym_size(0)), " entries but B has ", size_str(B.sym_size(0)),
                    " matrices (B.size(0)): pass one count per group");
  return empty_masked_d(op, A, B);
}

// -- grouped calls, the list form (CUTLASS's GroupedGemm; generator/runtime/op.py: GemmOp.run_grouped_list) ---------
//
// A[i] (M_i, K_i) and B[i] (K_i, N_i), each in the plan's order and of its own sizes; D[i] = A[i] @ B[i], a fresh
// (M_i, N_i) in the plan's order of D. One launch (GemmArgs' list) on the sm90 family's persistent kernels: other
// plans (OpSpec::grouped_list_refusal) and operands off the 16-byte rule are refused here, before any launch. The
// list holds the problems with work only: D[i] of M_i or N_i = 0 is empty, and of K_i = 0 zeroed here (a sum of
// nothing), so those problems' operands need not keep the rule. The library's launch copies each problem's addresses
// and sizes to the device (its tensor maps are built there), so a list call cannot be captured into a CUDA graph.

// What a list call hears while its stream is being captured (after "<op>: ").
inline constexpr const char kListCaptureRefusal[] =
    "a list call copies its problems' addresses and sizes from the host to the device at each call, which a CUDA "
    "graph capture cannot hold: call it outside the capture, or use the offsets form op.grouped(A, B, offsets), "
    "whose launch is capturable";

// "A[3]": a list call's matrix (or size), in messages; on the stack, for the checks every problem passes (a call of
// 128 problems names 640 matrices and sizes, a heap string each before).
struct ListName {
  char text[32];
  ListName(const char* what, size_t i) { std::snprintf(text, sizeof text, "%s[%zu]", what, i); }
  const char* c_str() const { return text; }
};

// The same name as a string, for the messages built only on failure.
inline std::string list_item(const char* what, size_t i) { return ListName(what, i).c_str(); }

// check(name) for matrix i of a list ("A" or "B"), its name formatted only where the check fails: the check runs
// with the bare "A" or "B" (the checks read the name's first letter), and only if that throws runs again with "A[3]",
// whose error is the one raised. Formatting every name up front cost about 0.2 us each, four per problem. The checks
// have no side effects, so running one twice on failure is harmless.
template <typename Check>
inline auto checked_as_list_item(const char* what, size_t i, Check&& check) {
  try {
    return check(what);
  } catch (const c10::Error&) {
  }
  return check(ListName(what, i).c_str());
}

inline void check_list_lengths(at::TensorList A, at::TensorList B) {
  TORCH_CHECK_VALUE(A.size() == B.size(), "A has ", A.size(), " matrices but B has ", B.size(), ": pass one B per A");
}

inline std::string list_k_message(size_t i, const at::Tensor& a, const at::Tensor& b) {
  const std::string x = list_item("A", i), y = list_item("B", i);
  return x + " is " + tuple_str(a.sym_sizes()) + " and " + y + " is " + tuple_str(b.sym_sizes()) +
         ": K must agree (" + x + "'s columns = " + y + "'s rows); for x @ W.t() pass " + y + " = W.t()";
}

// Every matrix of a list call on A[0]'s device.
inline void check_list_device(const char* what, const at::Tensor& t, const at::Tensor& first) {
  TORCH_CHECK_VALUE(t.device() == first.device(), what, " is on ", t.device().str(), " but A[0] on ",
                    first.device().str(), ": put every matrix of A and B on one GPU, e.g. pass ", what, ".to('",
                    first.device().str(), "')");
}

// Problem i of a list call as its checked A[i] and B[i] describe it.
struct ListProblem {
  int64_t m, n, k, lda, ldb;
  bool has_work() const { return m > 0 && n > 0 && k > 0; }
};

inline ListProblem check_list_pair(const OpSpec& op, size_t i, const at::Tensor& a, const at::Tensor& b,
                                   const at::Tensor& first) {
  const int64_t lda = checked_as_list_item("A", i, [&](const char* x) {
    const int64_t ld = check_operand(op, a, x, op.a_row, CallForm::list);
    check_list_device(x, a, first);
    return ld;
  });
  const int64_t ldb = checked_as_list_item("B", i, [&](const char* y) {
    const int64_t ld = check_operand(op, b, y, op.b_row, CallForm::list);
    check_list_device(y, b, first);
    return ld;
  });
  TORCH_CHECK_VALUE(a.size(1) == b.size(0), list_k_message(i, a, b));
  for (const auto& [what, size] : {std::pair<const char*, int64_t>{"M", a.size(0)}, {"N", b.size(1)}, {"K", a.size(1)}}) {
    if (size > kInt32Max) check_index(ListName(what, i).c_str(), size);
  }
  return ListProblem{a.size(0), b.size(1), a.size(1), lda, ldb};
}

// The lists' lengths, then each pair (A[i], then B[i], their device, K, the int32 limit), in order.
inline std::vector<ListProblem> check_list_operands(const OpSpec& op, at::TensorList A, at::TensorList B) {
  check_list_lengths(A, B);
  std::vector<ListProblem> problems;
  problems.reserve(A.size());
  for (size_t i = 0; i < A.size(); ++i) problems.push_back(check_list_pair(op, i, A[i], B[i], A[0]));
  return problems;
}

// D[i] (M_i, N_i) in the plan's order (sizes may be symbolic: shared with the Meta impl).
inline std::vector<at::Tensor> empty_list_d(const OpSpec& op, at::TensorList A, at::TensorList B) {
  std::vector<at::Tensor> D;
  D.reserve(A.size());
  for (size_t i = 0; i < A.size(); ++i) {
    D.push_back(empty_matrix(op, A[i].sym_size(0), B[i].sym_size(1), A[i].options()));
  }
  return D;
}

// D[i] (M_i, N_i) in the plan's order, on the GPU: one allocation cut into each problem's own matrix, each D[i] a
// tensor of its own storage over its own bytes (they alias nothing, as torch.library.opcheck asks of outputs), the
// allocation freed with the last of them. 128 allocations cost about 2.4 us each on the host (the caching
// allocator's lock and bookkeeping), more than the launch's GPU time at 128 small problems (docs/grouped.md); a
// tensor over given memory costs a fraction of that. Matrices start kListDAlignment bytes apart at least.
inline constexpr int64_t kListDAlignment = 256;

inline std::vector<at::Tensor> list_d_in_one_allocation(const OpSpec& op, const at::TensorOptions& like,
                                                        const std::vector<ListProblem>& problems) {
  const at::TensorOptions options = like.dtype(op.out_dtype);
  const int64_t element = static_cast<int64_t>(c10::elementSize(op.out_dtype));
  std::vector<int64_t> offsets(problems.size());
  int64_t bytes = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    offsets[i] = bytes;
    bytes += (problems[i].m * problems[i].n * element + kListDAlignment - 1) / kListDAlignment * kListDAlignment;
  }
  const at::Tensor block = at::empty({bytes}, options.dtype(at::kByte));
  auto* base = static_cast<char*>(block.data_ptr());
  std::vector<at::Tensor> D;
  D.reserve(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    const int64_t m = problems[i].m, n = problems[i].n;
    if (m * n == 0) {
      D.push_back(empty_matrix(op, m, n, options));
      continue;
    }
    const std::array<int64_t, 2> sizes = {m, n}, strides = {op.d_row ? n : 1, op.d_row ? 1 : m};
    D.push_back(at::for_blob(base + offsets[i], sizes)
                    .strides(strides)
                    .deleter([block](void*) {})  // (holds the allocation until this D is freed)
                    .options(options)
                    .target_device(block.device())
                    .make_tensor());
  }
  return D;
}

// The GemmListProblems of the problems with work, in order (M_i, N_i or K_i of 0: nothing to launch).
inline std::vector<GemmListProblem> list_problems(const OpSpec& op, at::TensorList A, at::TensorList B,
                                                  const std::vector<at::Tensor>& D,
                                                  const std::vector<ListProblem>& problems) {
  std::vector<GemmListProblem> list;
  for (size_t i = 0; i < problems.size(); ++i) {
    const ListProblem& p = problems[i];
    if (!p.has_work()) continue;
    list.push_back(GemmListProblem{A[i].data_ptr(), B[i].data_ptr(), D[i].data_ptr(), p.m, p.n, p.k, p.lda, p.ldb,
                                   leading_dim(D[i], op.d_row)});
  }
  return list;
}

// The 16-byte rule of the list kernel's TMA loads, for the problems with work (the others are not launched): A[0],
// B[0], A[1], ...
inline void check_list_alignment(const OpSpec& op, at::TensorList A, at::TensorList B,
                                 const std::vector<ListProblem>& problems) {
  for (size_t i = 0; i < problems.size(); ++i) {
    if (!problems[i].has_work()) continue;
    checked_as_list_item("A", i, [&](const char* x) {
      check_grouped_alignment(x, A[i], op.a_row, problems[i].lda, 0);
    });
    checked_as_list_item("B", i, [&](const char* y) {
      check_grouped_alignment(y, B[i], op.b_row, problems[i].ldb, 0);
    });
  }
}

// The checks in GemmOp.run_grouped_list's order: the plan, the lists and each pair, the 16-byte rule of the problems
// with work, a capture of the stream; then D, and one launch for the problems with work (none: no launch).
inline std::vector<at::Tensor> gemm_grouped_list(const OpSpec& op, at::TensorList A, at::TensorList B) {
  refuse_grouped_list_plan(op);
  const std::vector<ListProblem> problems = check_list_operands(op, A, B);
  check_list_alignment(op, A, B, problems);
  if (A.empty()) return {};
  const c10::Device device = A[0].device();
  const c10::cuda::OptionalCUDAGuard guard(launch_device(op, A[0]));
  TORCH_CHECK_VALUE(!stream_capturing(op), op.op, ": ", kListCaptureRefusal);
  std::vector<at::Tensor> D =
      on_cuda(op) ? list_d_in_one_allocation(op, A[0].options(), problems) : empty_list_d(op, A, B);
  for (size_t i = 0; i < D.size(); ++i) {
    if (problems[i].k == 0) D[i].zero_();  // a sum of nothing; the kernel does not see this problem
  }
  std::vector<GemmListProblem> list = list_problems(op, A, B, D, problems);
  if (list.empty()) return D;
  check_arch(op, device);
  GemmArgs args{};
  args.batch = static_cast<int64_t>(list.size());
  args.list = list.data();  // read during the launch only
  call_launch(op, device, args);
  return D;
}

// Meta tensors: each D[i]'s shape, dtype and strides after the checks that need no data.
inline std::vector<at::Tensor> gemm_grouped_list_meta(const OpSpec& op, at::TensorList A, at::TensorList B) {
  refuse_grouped_list_plan(op);
  check_list_lengths(A, B);
  for (size_t i = 0; i < A.size(); ++i) {
    const ListName x("A", i), y("B", i);
    check_rank_and_dtype(op, A[i], x.c_str(), CallForm::list);
    check_rank_and_dtype(op, B[i], y.c_str(), CallForm::list);
    check_list_device(x.c_str(), A[i], A[0]);
    check_list_device(y.c_str(), B[i], A[0]);
    TORCH_CHECK_VALUE(A[i].sym_size(1).sym_eq(B[i].sym_size(0)).expect_true(__FILE__, __LINE__),
                      list_k_message(i, A[i], B[i]));
  }
  return empty_list_d(op, A, B);
}

// -- the kernels registered with the dispatcher ------------------------------------------------------

// One functor type per overload and dispatch key, holding its op's OpSpec. The dispatcher's boxing
// wrappers are template instances per kernel type, so types shared by every op keep this file's compile
// time (the longest job of the package's build) nearly flat in the number of ops.
struct GemmKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B) const { return gemm(*op, A, B); }
};
struct GemmOutKernel {
  const OpSpec* op;
  at::Tensor& operator()(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) const {
    return gemm_out(*op, A, B, out);
  }
};
struct GemmMetaKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B) const { return gemm_meta(*op, A, B); }
};
struct GemmOutMetaKernel {
  const OpSpec* op;
  at::Tensor& operator()(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) const {
    return gemm_out_meta(*op, A, B, out);
  }
};
struct GemmOutDecompositionKernel {
  const OpSpec* op;
  at::Tensor& operator()(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) const {
    return gemm_out_decomposition(*op, A, B, out);
  }
};
struct GemmGroupedKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B, const at::Tensor& offsets) const {
    return gemm_grouped(*op, A, B, offsets);
  }
};
struct GemmGroupedMetaKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B, const at::Tensor& offsets) const {
    return gemm_grouped_meta(*op, A, B, offsets);
  }
};
struct GemmGroupedScaledKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B, const at::Tensor& offsets, const at::Tensor& scale_a,
                        const at::Tensor& scale_b) const {
    const GroupedScales scales{scale_a, scale_b};
    return gemm_grouped(*op, A, B, offsets, &scales);
  }
};
struct GemmMaskedScaledKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B, const at::Tensor& counts, const at::Tensor& scale_a,
                        const at::Tensor& scale_b) const {
    const GroupedScales scales{scale_a, scale_b};
    return gemm_masked(*op, A, B, counts, &scales);
  }
};
// The scales' checks of a scaled grouped call that need no data (emitted packages' Meta kernels of .grouped_scaled
// and .masked_scaled; the JIT ops' fake is GemmOp._check_grouped_scales_meta): each a tensor, fp32, on A's device.
inline void check_grouped_scales_meta(const OpSpec& op, const GroupedScales& scales, const at::Tensor& A) {
  TORCH_CHECK(op.num_operands == 2, op.op, ": a scaled grouped call needs a plan whose only operands are per-block "
              "or per-row scales");
  const at::Tensor* values[2] = {&scales.a, &scales.b};
  for (int i = 0; i < 2; ++i) {
    const OperandSpec& o = op.operands[i];
    const at::Tensor& t = *values[i];
    TORCH_CHECK_TYPE(t.defined(), o.name, " must be a torch.Tensor of shape ", operand_shape(o), ", got NoneType");
    TORCH_CHECK_TYPE(t.scalar_type() == o.dtype && t.device() == A.device(), o.name, " is ",
                     torch_dtype(t.scalar_type()), " on ", t.device().str(), "; the scales are ",
                     torch_dtype(o.dtype), " on A's device (", A.device().str(), ")");
  }
}
struct GemmGroupedScaledMetaKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B, const at::Tensor& offsets, const at::Tensor& scale_a,
                        const at::Tensor& scale_b) const {
    check_rank_and_dtype(*op, B, "B", CallForm::grouped);  // a scaled call is one of rows (B 3-D), never along K
    at::Tensor D = gemm_grouped_meta(*op, A, B, offsets);
    check_grouped_scales_meta(*op, GroupedScales{scale_a, scale_b}, A);
    return D;
  }
};
struct GemmMaskedScaledMetaKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B, const at::Tensor& counts, const at::Tensor& scale_a,
                        const at::Tensor& scale_b) const {
    at::Tensor D = gemm_masked_meta(*op, A, B, counts);
    check_grouped_scales_meta(*op, GroupedScales{scale_a, scale_b}, A);
    return D;
  }
};
struct GemmMaskedKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B, const at::Tensor& counts) const {
    return gemm_masked(*op, A, B, counts);
  }
};
struct GemmMaskedMetaKernel {
  const OpSpec* op;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B, const at::Tensor& counts) const {
    return gemm_masked_meta(*op, A, B, counts);
  }
};
struct GemmGroupedListKernel {
  const OpSpec* op;
  std::vector<at::Tensor> operator()(at::TensorList A, at::TensorList B) const {
    return gemm_grouped_list(*op, A, B);
  }
};
struct GemmGroupedListMetaKernel {
  const OpSpec* op;
  std::vector<at::Tensor> operator()(at::TensorList A, at::TensorList B) const {
    return gemm_grouped_list_meta(*op, A, B);
  }
};

// -- ops with a fused epilogue: boxed kernels ---------------------------------------------------------
//
// Schema (Tensor A, Tensor B, <operands>) -> Tensor, or -> (Tensor, Tensor) with aux (-> (Tensor, Tensor, Tensor)
// with a quantized D's scales and amax); .out adds
// `*, Tensor(a!) out` and returns out. Each kernel takes its call's arguments, the last 2 + num_operands
// (+ 1 for out) values of the stack, and leaves the outputs in their place. The checks run in
// generator/runtime/op.py's order (GemmOp.run): A and B, the operands, out, out's aliasing; then the launch.

inline size_t argument_count(const OpSpec& op, bool with_out) {
  return 2 + static_cast<size_t>(op.num_operands) + (with_out ? 1 : 0);
}

// The first of a call's count arguments on the stack.
inline const c10::IValue* arguments(const torch::jit::Stack& stack, size_t count) {
  TORCH_INTERNAL_ASSERT(stack.size() >= count, "gemmgen: ", count, " arguments expected on the stack");
  return stack.data() + (stack.size() - count);
}

// out= cannot take the second output: refused before any check (as GemmOp's run_out).
inline void refuse_aux_out(const OpSpec& op) {
  TORCH_CHECK_VALUE(!op.aux, op.op, ".out: the plan has a second output (", second_output_name(op),
                    "), which out= cannot receive: call the op without out=");
}

inline void replace_arguments(torch::jit::Stack& stack, size_t count, at::Tensor D, at::Tensor aux = at::Tensor(),
                              at::Tensor amax = at::Tensor()) {
  torch::jit::drop(stack, count);
  stack.emplace_back(std::move(D));
  if (aux.defined()) stack.emplace_back(std::move(aux));
  if (amax.defined()) stack.emplace_back(std::move(amax));
}

inline void gemm_epilogue(const OpSpec& op, torch::jit::Stack& stack) {
  const size_t count = argument_count(op, false);
  const c10::IValue* args = arguments(stack, count);
  const at::Tensor& A = tensor_value(args[0]);
  const at::Tensor& B = tensor_value(args[1]);
  const Problem p = check_operands(op, A, B);
  if (p.batched) check_batched_epilogue(op);
  GemmArgs launch_args{};
  check_epilogue_operands(op, args + 2, A, p.m, p.n, p.k, launch_args);
  const c10::cuda::OptionalCUDAGuard guard(launch_device(op, A));
  at::Tensor D = empty_d(op, A, B);
  at::Tensor aux = empty_second_output(op, A, B);  // (a batched call has none: refused)
  at::Tensor amax = zeroed_amax(op, A);
  launch(op, A, B, D, p, leading_dim(D, op.d_row), batch_stride(D), launch_args, op.aux ? &aux : nullptr,
         op.amax ? &amax : nullptr);
  replace_arguments(stack, count, std::move(D), std::move(aux), std::move(amax));  // A and B are gone from here on
}

inline void gemm_epilogue_out(const OpSpec& op, torch::jit::Stack& stack) {
  refuse_aux_out(op);
  const size_t count = argument_count(op, true);
  const c10::IValue* args = arguments(stack, count);
  const at::Tensor& A = tensor_value(args[0]);
  const at::Tensor& B = tensor_value(args[1]);
  at::Tensor out = tensor_value(args[count - 1]);
  const Problem p = check_operands(op, A, B);
  if (p.batched) check_batched_epilogue(op);
  GemmArgs launch_args{};
  check_epilogue_operands(op, args + 2, A, p.m, p.n, p.k, launch_args);
  const auto [ldd, batch_stride_d] = check_out(op, out, A, B);
  check_out_aliasing(op, args + 2, out, A, B);
  const c10::cuda::OptionalCUDAGuard guard(launch_device(op, A));
  launch(op, A, B, out, p, ldd, batch_stride_d, launch_args);
  replace_arguments(stack, count, std::move(out));
}

// Meta tensors: D's (and the second output's) shape, dtype and strides after the checks that need no data.
inline void gemm_epilogue_meta(const OpSpec& op, torch::jit::Stack& stack) {
  const size_t count = argument_count(op, false);
  const c10::IValue* args = arguments(stack, count);
  const at::Tensor& A = tensor_value(args[0]);
  const at::Tensor& B = tensor_value(args[1]);
  at::Tensor D = gemm_meta(op, A, B);
  if (is_batched(A, B)) check_batched_epilogue(op);
  check_operands_static(op, args + 2, A);
  at::Tensor aux = empty_second_output(op, A, B);
  replace_arguments(stack, count, std::move(D), std::move(aux), zeroed_amax(op, A));
}

inline void gemm_epilogue_out_meta(const OpSpec& op, torch::jit::Stack& stack) {
  refuse_aux_out(op);
  const size_t count = argument_count(op, true);
  const c10::IValue* args = arguments(stack, count);
  const at::Tensor& A = tensor_value(args[0]);
  at::Tensor out = tensor_value(args[count - 1]);
  gemm_meta(op, A, tensor_value(args[1]));
  if (is_batched(A, tensor_value(args[1]))) check_batched_epilogue(op);
  check_operands_static(op, args + 2, A);
  check_out_shape_and_dtype(op, out, A, tensor_value(args[1]));
  replace_arguments(stack, count, std::move(out));
}

// .out under FakeTensor and functionalization, as gemm_out_decomposition: the checks, the default overload
// with the same operands, a copy into out.
inline void gemm_epilogue_out_decomposition(const OpSpec& op, torch::jit::Stack& stack) {
  refuse_aux_out(op);
  const size_t count = argument_count(op, true);
  const c10::IValue* args = arguments(stack, count);
  const at::Tensor& A = tensor_value(args[0]);
  const at::Tensor& B = tensor_value(args[1]);
  at::Tensor out = tensor_value(args[count - 1]);
  check_rank_and_dtype(op, A, "A");
  check_rank_and_dtype(op, B, "B");
  check_k(A, B);
  if (is_batched(A, B)) check_batched_epilogue(op);
  check_operands_static(op, args + 2, A);
  check_out_shape_and_dtype(op, out, A, B);
  torch::jit::Stack call(args, args + count - 1);
  c10::Dispatcher::singleton().findSchemaOrThrow((std::string(op.ns) + "::" + op.op).c_str(), "").callBoxed(call);
  out.copy_(call.front().toTensor());
  replace_arguments(stack, count, std::move(out));
}

// What an .out overload says when an argument requires grad (follows the op's name): out= is not differentiable,
// as aten's out= ops, while the default overload is (gemm_autograd.h's GemmOutAutogradKernel, and the .out of an
// emitted package's epilogue op; the JIT ops' Python refusal says the same).
inline constexpr const char kOutNotDifferentiable[] =
    ".out: functions with out=... arguments don't support automatic differentiation, but one of the arguments "
    "requires grad: call the op without out= (its backward is registered)";

// The Autograd kernels of an emitted package's epilogue op: they refuse arguments that require grad, at the call,
// rather than leaving a result without a gradient; without grad mode they go on to the kernel. Emitted with
// autograd, the package registers the default overload's formula in Python (its __init__.py), so only .out has
// this kernel, with aten's words (backward_registered); without autograd, both overloads have it.
inline void refuse_grad(const OpSpec& op, const torch::jit::Stack& stack, bool with_out, bool backward_registered) {
  if (!at::GradMode::is_enabled()) return;
  const size_t count = argument_count(op, with_out);
  const c10::IValue* args = arguments(stack, count);
  for (size_t i = 0; i < count; ++i) {
    const at::Tensor& t = tensor_value(args[i]);
    if (!(t.defined() && t.requires_grad())) continue;
    TORCH_CHECK(!backward_registered, op.op, kOutNotDifferentiable);
    const bool quantized = op.dtype == c10::ScalarType::Float8_e4m3fn || op.dtype == c10::ScalarType::Float8_e5m2 ||
                           op.dtype == c10::ScalarType::Char;
    TORCH_CHECK(!quantized, op.op, with_out ? ".out" : "", " multiplies ", op.dtype_name,
                " operands and has no backward pass, but one of the arguments requires grad: call it under "
                "torch.no_grad() or with detached tensors; train through a bf16 or tf32 op");
    TORCH_CHECK(false, op.op, with_out ? ".out" : "",
                ": this op has a fused epilogue, which the package cannot differentiate (it was emitted without "
                "autograd), but one of the arguments requires grad: call it under torch.no_grad() or with detached "
                "tensors, or emit the package with autograd (the default)");
  }
}

// The boxed kernel types: one per overload and dispatch key, whatever the op (see the unboxed ones above).
using BoxedImpl = void (*)(const OpSpec&, torch::jit::Stack&);

template <BoxedImpl Impl>
class EpilogueBoxedKernel final : public c10::OperatorKernel {
 public:
  explicit EpilogueBoxedKernel(const OpSpec* op) : op_(op) {}
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) { Impl(*op_, *stack); }

 private:
  const OpSpec* op_;
};

template <bool WithOut>
class EpilogueAutogradKernel final : public c10::OperatorKernel {
 public:
  EpilogueAutogradKernel(const OpSpec* op, bool backward_registered)
      : op_(op), backward_registered_(backward_registered) {}
  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet, torch::jit::Stack* stack) {
    refuse_grad(*op_, *stack, WithOut, backward_registered_);
    if constexpr (WithOut) {  // as GemmOutAutogradKernel
      at::AutoDispatchBelowAutograd below;
      handle.callBoxed(stack);
    } else {  // as GemmAutogradKernel without grad
      at::AutoDispatchBelowADInplaceOrView below;
      handle.callBoxed(stack);
    }
  }

 private:
  const OpSpec* op_;
  bool backward_registered_;
};

template <BoxedImpl Impl>
inline torch::CppFunction boxed(const OpSpec* op) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<EpilogueBoxedKernel<Impl>>(op));
}

// What binding.cpp and the JIT runtime register for an op with a fused epilogue (has_epilogue_schema).
inline torch::CppFunction epilogue_kernel(const OpSpec* op) { return boxed<gemm_epilogue>(op); }
inline torch::CppFunction epilogue_out_kernel(const OpSpec* op) { return boxed<gemm_epilogue_out>(op); }
inline torch::CppFunction epilogue_meta_kernel(const OpSpec* op) { return boxed<gemm_epilogue_meta>(op); }
inline torch::CppFunction epilogue_out_meta_kernel(const OpSpec* op) { return boxed<gemm_epilogue_out_meta>(op); }
inline torch::CppFunction epilogue_out_decomposition_kernel(const OpSpec* op) {
  return boxed<gemm_epilogue_out_decomposition>(op);
}
// The Autograd kernels of an epilogue op (refuse_grad): the default overload's for a package without autograd;
// .out's always, backward_registered when the package registers the default overload's formula.
inline torch::CppFunction epilogue_autograd_kernel(const OpSpec* op) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<EpilogueAutogradKernel<false>>(op, false));
}
inline torch::CppFunction epilogue_out_autograd_kernel(const OpSpec* op, bool backward_registered) {
  return torch::CppFunction::makeFromBoxedFunctor(
      std::make_unique<EpilogueAutogradKernel<true>>(op, backward_registered));
}

// The Autograd kernels of .grouped and .grouped_list in packages emitted without autograd (and of fp8 and int8 ops,
// which are forward only): their grouped calls have no backward pass, so one that would need a gradient is refused at
// the call (generator/runtime/autograd.py keeps these words), rather than answered with a result that has none;
// without grad mode it goes on to the kernel. JIT ops and packages emitted with autograd differentiate grouped calls
// with generator/runtime/grouped_formula.py's formulas instead (registered in Python). .masked has no formula yet:
// every package's refuses grad (refuse_masked_grad). Boxed: the dispatcher hands it the handle.
inline void refuse_grouped_grad(const char* op, const char* overload, const std::string& wanting) {
  TORCH_CHECK(wanting.empty(), op, ".", overload, ": grouped calls have no backward pass yet, but ", wanting,
              " require(s) grad: call it under torch.no_grad() or with detached tensors");
}

// wanting += ", name" where t requires grad.
inline void add_wanting(std::string& wanting, const std::string& name, const at::Tensor& t) {
  if (t.defined() && t.requires_grad()) wanting += (wanting.empty() ? "" : ", ") + name;
}

// .grouped's arguments (A, B, offsets): "A", "B" or "A, B".
inline std::string grouped_wanting(const c10::IValue* args) {
  std::string wanting;
  add_wanting(wanting, "A", tensor_value(args[0]));
  add_wanting(wanting, "B", tensor_value(args[1]));
  return wanting;
}

// .grouped_list's arguments (A, B: lists): "A[0], B[2]", A's first.
inline std::string grouped_list_wanting(const c10::IValue* args) {
  std::string wanting;
  for (const auto& [what, value] : {std::pair<const char*, const c10::IValue*>{"A", args}, {"B", args + 1}}) {
    const std::vector<at::Tensor> matrices = value->toTensorVector();
    for (size_t i = 0; i < matrices.size(); ++i) add_wanting(wanting, list_item(what, i), matrices[i]);
  }
  return wanting;
}

// A masked call that would need a gradient: its words are generator/runtime/autograd.py's _register_masked_refusal's
// (a masked call has no backward formula yet, also in packages emitted with autograd).
inline void refuse_masked_grad(const char* op, const std::string& wanting) {
  TORCH_CHECK(wanting.empty(), op, ".masked: masked calls have no backward pass yet, but ", wanting,
              " require(s) grad: call it under torch.no_grad() (inference), or train through op.grouped(A, B, "
              "offsets), which is differentiable");
}

enum class GroupedOverload { grouped, grouped_list, masked };

template <GroupedOverload Overload>
class GroupedAutogradKernel final : public c10::OperatorKernel {
 public:
  explicit GroupedAutogradKernel(const char* op) : op_(op) {}
  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet, torch::jit::Stack* stack) {
    if (at::GradMode::is_enabled()) {
      constexpr bool kList = Overload == GroupedOverload::grouped_list;
      const c10::IValue* args = arguments(*stack, kList ? 2 : 3);
      if constexpr (Overload == GroupedOverload::masked) {
        refuse_masked_grad(op_, grouped_wanting(args));
      } else {
        refuse_grouped_grad(op_, kList ? "grouped_list" : "grouped", kList ? grouped_list_wanting(args)
                                                                           : grouped_wanting(args));
      }
    }
    at::AutoDispatchBelowADInplaceOrView below;
    handle.callBoxed(stack);
  }

 private:
  const char* op_;  // the op's name (a string that outlives the registration)
};

inline torch::CppFunction grouped_autograd_kernel(const char* op) {
  return torch::CppFunction::makeFromBoxedFunctor(
      std::make_unique<GroupedAutogradKernel<GroupedOverload::grouped>>(op));
}
inline torch::CppFunction grouped_list_autograd_kernel(const char* op) {
  return torch::CppFunction::makeFromBoxedFunctor(
      std::make_unique<GroupedAutogradKernel<GroupedOverload::grouped_list>>(op));
}
// .masked's, in every emitted package (with autograd too: a masked call has no formula yet)
inline torch::CppFunction masked_autograd_kernel(const char* op) {
  return torch::CppFunction::makeFromBoxedFunctor(
      std::make_unique<GroupedAutogradKernel<GroupedOverload::masked>>(op));
}

// The Autograd kernels of an fp8 op's .grouped_scaled and .masked_scaled (emitted packages; the JIT ops' are
// generator/runtime/autograd.py _register_scaled_grouped_refusal, whose words these are): fp8 GEMMs are forward only,
// so a call that would need a gradient of A or B is refused; without grad mode it goes on to the kernel.
class ScaledGroupedAutogradKernel final : public c10::OperatorKernel {
 public:
  ScaledGroupedAutogradKernel(const OpSpec* op, const char* overload) : op_(op), overload_(overload) {}
  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet, torch::jit::Stack* stack) {
    if (at::GradMode::is_enabled()) {
      const std::string wanting = grouped_wanting(arguments(*stack, 5));  // (A, B, offsets or counts, scales)
      TORCH_CHECK(wanting.empty(), op_->op, ".", overload_, " multiplies ", op_->dtype_name,
                  " operands and has no backward pass, but ", wanting, " require(s) grad: call it under "
                  "torch.no_grad(), or pass ", wanting.substr(0, wanting.find(',')),
                  ".detach(); train through a bf16 or tf32 plan");
    }
    at::AutoDispatchBelowADInplaceOrView below;
    handle.callBoxed(stack);
  }

 private:
  const OpSpec* op_;
  const char* overload_;  // "grouped_scaled" or "masked_scaled"
};

inline torch::CppFunction scaled_grouped_autograd_kernel(const OpSpec* op, const char* overload) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<ScaledGroupedAutogradKernel>(op, overload));
}

// As gemmgen's JIT ops: needs_fixed_stride_order keeps the operands' strides under Inductor (a
// column-major B stays column-major, so the op's layout holds in compiled graphs), and the ops are
// pt2-compliant (meta implementations, no data-dependent output shapes).
inline const std::vector<at::Tag>& op_tags() {
  static const std::vector<at::Tag> tags = {at::Tag::needs_fixed_stride_order, at::Tag::pt2_compliant_tag};
  return tags;
}

}  // namespace gemmgen
