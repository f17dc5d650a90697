// The torch side of a gemmgen op: argument checks, allocation and launch of a kernel library's entry
// point, the Meta (fake) implementation and the .out decomposition, as dispatcher kernels. The autograd
// formula is torch/gemm_autograd.h (a header of its own: torch's autograd headers double the compile
// time of a file that includes them, and a package emitted without autograd does not need them).
//
// Shared by the two ways an op reaches torch: an emitted package's binding.cpp (its ops are fixed when it
// is generated: one constant OpSpec each) and gemmgen's JIT runtime (templates/torch/jit_runtime.cpp,
// one OpSpec per kernel library loaded at run time). This header and those two files are the only ones
// that include torch headers; the kernels are plain CUDA with the C interface of common/gemm_args.h.
// The messages are generator/runtime/op.py's (GemmOp._check*), so an op says the same whichever way it was built.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
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
};

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

inline const char* order_str(const at::Tensor& t) {
  if (t.dim() == 2 && t.stride(1) == 1) return "row-major";
  if (t.dim() == 2 && t.stride(0) == 1) return "column-major";
  return "neither row- nor column-major";
}

// The leading dimension of a 2-D tensor stored row-major (row) or column-major, or -1 if it is not
// stored so. A dimension of size 1 has no meaningful stride; its leading dimension is the other size.
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
  return leading_dim_of<int64_t>(t.size(0), t.size(1), t.stride(0), t.stride(1), row);
}

// Whether t is stored in the order (row: row-major), for tensors whose sizes may be symbolic.
inline bool stored_in(const at::Tensor& t, bool row) {
  return leading_dim_of<c10::SymInt>(t.sym_size(0), t.sym_size(1), t.sym_stride(0), t.sym_stride(1), row) >=
         c10::SymInt(0);
}

// D, allocated in the storage order the kernel writes (sizes may be symbolic: shared with the Meta impl).
inline at::Tensor empty_d(const OpSpec& op, const c10::SymInt& m, const c10::SymInt& n, const at::TensorOptions& options) {
  if (op.d_row) return at::empty_symint({m, n}, options.dtype(op.out_dtype));
  return at::empty_symint({n, m}, options.dtype(op.out_dtype)).t();
}

// -- checks ------------------------------------------------------------------------------------------

// Rank and dtype of A or B: the checks that need no data (the Meta impl runs them too).
inline void check_rank_and_dtype(const OpSpec& op, const at::Tensor& t, const char* what) {
  const bool is_a = what[0] == 'A';
  TORCH_CHECK_VALUE(t.dim() == 2, what, " must be 2-D ", is_a ? "(M, K)" : "(K, N)", "; got shape ",
                    tuple_str(t.sym_sizes()));
  TORCH_CHECK_TYPE(t.scalar_type() == op.dtype, what, " is ", torch_dtype(t.scalar_type()), "; this plan computes ",
                   op.dtype_name, ": pass ", what, ".to(", torch_dtype(op.dtype), ") or plan with dtype='",
                   dtype_name(t.scalar_type()), "'");
}

// A or B on the GPU; returns its leading dimension.
inline int64_t check_operand(const OpSpec& op, const at::Tensor& t, const char* what, bool row) {
  check_rank_and_dtype(op, t, what);
  TORCH_CHECK_VALUE(t.is_cuda(), what, " is on ", t.device().str(), "; this op runs on CUDA tensors: pass ", what,
                    ".cuda()");
  const int64_t ld = leading_dim(t, row);
  const bool is_a = what[0] == 'A';
  TORCH_CHECK_VALUE(ld >= 0, what, " has strides ", tuple_str(t.strides()), " (", order_str(t),
                    "); this plan was made for layout_", is_a ? "a" : "b", "='", row ? "row" : "col",
                    "': plan with layout='", is_a ? op.layout_a_flipped : op.layout_b_flipped, "' or pass ", what,
                    row ? ".contiguous()" : ".t().contiguous().t() (a column-major copy)");
  return ld;
}

inline void check_k(const at::Tensor& A, const at::Tensor& B) {
  TORCH_CHECK_VALUE(A.sym_size(1).sym_eq(B.sym_size(0)).expect_true(__FILE__, __LINE__), "A is ",
                    tuple_str(A.sym_sizes()), " and B is ", tuple_str(B.sym_sizes()),
                    ": K must agree (A's columns = B's rows); for x @ W.t() pass B = W.t()");
}

inline void check_index(const char* what, int64_t size) {
  TORCH_CHECK_VALUE(size <= kInt32Max, what, "=", size, " is larger than the kernels index (2**31 - 1): split the problem");
}

inline std::pair<int64_t, int64_t> check_operands(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  const int64_t lda = check_operand(op, A, "A", op.a_row);
  const int64_t ldb = check_operand(op, B, "B", op.b_row);
  TORCH_CHECK_VALUE(A.device() == B.device(), "A is on ", A.device().str(), " and B on ", B.device().str(),
                    ": put both on one GPU");
  check_k(A, B);
  check_index("M", A.size(0));
  check_index("N", B.size(1));
  check_index("K", A.size(1));
  return std::make_pair(lda, ldb);
}

// Shape and dtype of out (the Meta impl runs this too).
inline void check_out_shape_and_dtype(const OpSpec& op, const at::Tensor& out, const at::Tensor& A, const at::Tensor& B) {
  const c10::SymInt m = A.sym_size(0), n = B.sym_size(1);
  TORCH_CHECK_VALUE(out.dim() == 2 && out.sym_size(0).sym_eq(m).expect_true(__FILE__, __LINE__) &&
                        out.sym_size(1).sym_eq(n).expect_true(__FILE__, __LINE__),
                    "out has shape ", tuple_str(out.sym_sizes()), "; D = A @ B is (", size_str(m), ", ",
                    size_str(n), "): pass torch.empty(", size_str(m), ", ", size_str(n),
                    ", dtype=", torch_dtype(op.out_dtype), ", device='", A.device().str(), "')");
  TORCH_CHECK_TYPE(out.scalar_type() == op.out_dtype, "out is ", torch_dtype(out.scalar_type()),
                   "; this plan writes ", op.out_dtype_name, ": pass an out of dtype ", torch_dtype(op.out_dtype),
                   " or plan with out_dtype='", dtype_name(out.scalar_type()), "'");
}

// out on the GPU; returns its leading dimension.
inline int64_t check_out(const OpSpec& op, const at::Tensor& out, const at::Tensor& A, const at::Tensor& B) {
  check_out_shape_and_dtype(op, out, A, B);
  TORCH_CHECK_VALUE(out.device() == A.device(), "out is on ", out.device().str(), " but A and B on ",
                    A.device().str(), ": allocate out on ", A.device().str());
  const int64_t ld = leading_dim(out, op.d_row);
  TORCH_CHECK_VALUE(ld >= 0, "out has strides ", tuple_str(out.strides()), " (", order_str(out),
                    "); this plan writes D ", op.d_row ? "row" : "col", "-major: pass out=",
                    op.d_row ? "torch.empty(M, N)" : "torch.empty(N, M).t()", " or plan with layout_c='",
                    op.d_row ? "col" : "row", "'");
  return ld;
}

// The kernel was planned for op.arch (its shared memory and instructions); refuse an older GPU plainly.
inline void check_arch(const OpSpec& op, const c10::Device& device) {
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

inline at::Tensor& launch(const OpSpec& op, const at::Tensor& A, const at::Tensor& B, at::Tensor& D, int64_t lda,
                   int64_t ldb, int64_t ldd) {
  check_arch(op, A.device());
  if (D.numel() == 0) return D;  // M = 0 or N = 0; K = 0 launches: the kernel writes zeros
  GemmArgs args{A.data_ptr(), B.data_ptr(), D.data_ptr(), A.size(0), B.size(1), A.size(1), lda, ldb, ldd};
  const int code = op.launch(&args, c10::cuda::getCurrentCUDAStream(A.device().index()).stream());
  TORCH_CHECK(code == 0, op.kernel, ": launch failed: ", op.error_string(code));
  return D;
}

inline at::Tensor gemm(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  const auto [lda, ldb] = check_operands(op, A, B);
  const c10::cuda::CUDAGuard guard(A.device());
  at::Tensor D = empty_d(op, A.sym_size(0), B.sym_size(1), A.options());
  launch(op, A, B, D, lda, ldb, leading_dim(D, op.d_row));
  return D;
}

inline at::Tensor& gemm_out(const OpSpec& op, const at::Tensor& A, const at::Tensor& B, at::Tensor& out) {
  const auto [lda, ldb] = check_operands(op, A, B);
  const int64_t ldd = check_out(op, out, A, B);
  const c10::cuda::CUDAGuard guard(A.device());
  return launch(op, A, B, out, lda, ldb, ldd);
}

// Meta (fake) tensors: the result's shape, dtype and strides, for torch.compile and shape inference.
inline at::Tensor gemm_meta(const OpSpec& op, const at::Tensor& A, const at::Tensor& B) {
  check_rank_and_dtype(op, A, "A");
  check_rank_and_dtype(op, B, "B");
  check_k(A, B);
  return empty_d(op, A.sym_size(0), B.sym_size(1), A.options());
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

// As gemmgen's JIT ops: needs_fixed_stride_order keeps the operands' strides under Inductor (a
// column-major B stays column-major, so the op's layout holds in compiled graphs), and the ops are
// pt2-compliant (meta implementations, no data-dependent output shapes).
inline const std::vector<at::Tag>& op_tags() {
  static const std::vector<at::Tag> tags = {at::Tag::needs_fixed_stride_order, at::Tag::pt2_compliant_tag};
  return tags;
}

}  // namespace gemmgen
