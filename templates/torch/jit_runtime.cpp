// gemmgen's JIT runtime: gives each JIT-built op a C++ CUDA kernel in the dispatcher.
//
// A JIT op's kernel library is plain CUDA (no torch headers: a new kernel costs one nvcc run) and was
// first called from Python through ctypes, which cost 20-30 us of host time per call (the dispatcher's
// Python kernel, the checks in Python, ctypes). This library is built once per torch version and
// compiler (generator/runtime/jit_runtime.py) and loaded with ctypes; for every kernel library loaded,
// generator.runtime calls gemmgen_register_cuda_kernels, which registers templates/torch/gemm_op.h's kernels
// (the checks and launch of the emitted packages) for the op's CUDA dispatch key. The op's schema, its
// fake implementation, autograd formula and the kernels of other dispatch keys stay registered from
// Python (generator/runtime/op.py); CUDA tensors now skip Python between the dispatcher and the launch.
// A plain op gets gemm_op.h's unboxed kernels (its .grouped, .grouped_list and .masked overloads' too); an op with a
// fused epilogue (operands after A and B, maybe a second output) its boxed ones, with the epilogue's operands described
// in the spec.
// gemmgen_register_autograd likewise registers gemm_autograd.h's formula for every plain op when it is
// defined, so a call that needs no gradient does not go through Python either (the default overload and .out;
// a plain op's .grouped and .grouped_list keep Python's formulas, generator/runtime/autograd.py), and for an op
// whose epilogue is a Linear layer's, activation(acc + bias), its closed form (the default overload only).
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "torch/gemm_autograd.h"
#include "torch/gemm_op.h"

namespace {

// One operand of an op's fused epilogue (its ctypes mirror is JitOperandSpec in jit_runtime.py).
struct JitOperandSpec {
  int kind;           // gemmgen::OperandKind: 0 scalar, 1 row, 2 col, 3 matrix, 4 scalar_tensor, 5 row_blocks,
                      // 6 col_blocks
  const char* name;   // its name in the schema
  const char* dtype;  // "fp16" | "bf16" | "fp32"
  int row;            // a matrix: 1 = row-major, 0 = column-major
};

// What generator/runtime/jit_runtime.py passes for one op (its ctypes mirror is JitOpSpec there).
struct JitOpSpec {
  const char* ns;                // namespace of torch.ops.<ns>.<op>
  const char* op;                // op name (the kernel's name for JIT ops)
  const char* kernel;            // kernel name (<kernel>_launch, <kernel>_error_string)
  int arch;                      // the compute capability the kernel was planned for
  const char* dtype;             // of A and B: "fp16" | "bf16"
  const char* out_dtype;         // of D: "fp16" | "bf16" | "fp32"
  int a_row, b_row, d_row;       // storage orders: 1 = row-major, 0 = column-major
  const char* layout_a_flipped;  // the layout that would take A in the other order (for the advice)
  const char* layout_b_flipped;
  void* launch;                  // the kernel library's <kernel>_launch
  void* error_string;            // and <kernel>_error_string
  int num_operands;              // the fused epilogue's operands, in schema order (0 for a plain op)
  const JitOperandSpec* operands;
  int aux;                       // 1: a second output (the epilogue's aux, or a quantized D's scales)
  int device_type;               // c10::DeviceType of the tensors the kernels take: 1 CUDA (0 CPU: tests)
  const char* dtype_b;           // of B where it differs from A's (fp8 e4m3 x e5m2), else null
  const char* grouped_refusal;   // why the plan takes no grouped call, with the fix; null or "": it takes them
  const char* grouped_list_refusal;  // why it takes no list call (.grouped_list), likewise
  int num_buckets;               // an op over an M-bucketed op's kernels: how many besides the one above (else 0)
  const long long* bucket_rows;  // each bucket's most rows, increasing
  void* const* bucket_launch;    // each bucket's library's <kernel>_launch
  void* const* bucket_error_string;
  const char* const* bucket_kernel;
  int quant_block;               // a quantized (fp8) D: the columns of each of its scales (its second output); 0: none
  int amax;                      // with quant_block: nonzero returns the amax of D too (its third output)
};

// An OpSpec and the strings and operands it points to, and the registration that uses them.
struct RegisteredOp {
  std::string ns, op, kernel, dtype_name, out_dtype_name, layout_a_flipped, layout_b_flipped, dtype_b_name;
  std::string grouped_refusal, grouped_list_refusal;
  std::vector<std::string> operand_names, operand_dtype_names;  // sized once: the specs point into them
  std::vector<gemmgen::OperandSpec> operands;
  std::vector<int64_t> bucket_rows;                // the buckets of a bucketed op, sized once as operands
  std::vector<gemmgen::LaunchFn> bucket_launch;
  std::vector<gemmgen::ErrorStringFn> bucket_error_string;
  std::vector<std::string> bucket_kernel_names;
  std::vector<const char*> bucket_kernel;
  gemmgen::OpSpec spec{};
  torch::Library* library = nullptr;
};

c10::ScalarType scalar_type(const std::string& name) {
  if (name == "fp16") return c10::ScalarType::Half;
  if (name == "bf16") return c10::ScalarType::BFloat16;
  if (name == "fp32" || name == "tf32") return c10::ScalarType::Float;  // tf32: fp32 tensors, tf32 math
  if (name == "e4m3") return c10::ScalarType::Float8_e4m3fn;
  if (name == "e5m2") return c10::ScalarType::Float8_e5m2;
  if (name == "int8") return c10::ScalarType::Char;
  if (name == "int32") return c10::ScalarType::Int;
  TORCH_CHECK_VALUE(false, "gemmgen JIT runtime: unknown dtype '", name,
                    "' (fp16, bf16, fp32, tf32, e4m3, e5m2, int8 or int32)");
}

// The schema Python defined for the op must be the one the operands describe: the boxed kernels read the
// stack by this description.
void check_schema(const RegisteredOp& entry) {
  const auto handle = c10::Dispatcher::singleton().findSchema({entry.ns + "::" + entry.op, ""});
  TORCH_CHECK_VALUE(handle.has_value(), "gemmgen JIT runtime: ", entry.ns, "::", entry.op, " is not defined");
  const c10::FunctionSchema& schema = handle->schema();
  const auto& arguments = schema.arguments();
  const gemmgen::OpSpec& spec = entry.spec;
  bool same = arguments.size() == gemmgen::argument_count(spec, false) &&
              schema.returns().size() == 1u + (spec.aux ? 1u : 0u) + (spec.amax ? 1u : 0u);
  for (int i = 0; same && i < spec.num_operands; ++i) {
    const auto& argument = arguments[2 + i];
    const bool scalar = spec.operands[i].kind == gemmgen::OperandKind::Scalar;
    same = argument.name() == spec.operands[i].name &&
           argument.type()->kind() == (scalar ? c10::TypeKind::FloatType : c10::TypeKind::TensorType);
  }
  TORCH_CHECK_VALUE(same, "gemmgen JIT runtime: the schema of ", entry.ns, "::", entry.op,
                    " does not match the op spec's ", spec.num_operands, " epilogue operand(s)",
                    spec.aux ? " and aux" : "", spec.amax ? " and amax" : "");
}

// Whether Python defined the overload (a plain op's .grouped and .grouped_list: generator/runtime/registration.py's
// has_grouped).
bool has_overload(const std::string& ns, const std::string& op, const char* overload) {
  return c10::Dispatcher::singleton().findSchema({ns + "::" + op, overload}).has_value();
}

// The buckets of an op over an M-bucketed op's kernels, into entry (which keeps them for as long as the spec).
void copy_buckets(const JitOpSpec& in, RegisteredOp& entry) {
  TORCH_CHECK_VALUE(in.num_buckets >= 0 && (in.num_buckets == 0 || (in.bucket_rows && in.bucket_launch &&
                                                                     in.bucket_error_string && in.bucket_kernel)),
                    "gemmgen JIT runtime: incomplete buckets in the op spec");
  entry.bucket_kernel_names.reserve(in.num_buckets);
  for (int i = 0; i < in.num_buckets; ++i) {
    TORCH_CHECK_VALUE(in.bucket_launch[i] && in.bucket_error_string[i] && in.bucket_kernel[i] &&
                          (i == 0 || in.bucket_rows[i] > in.bucket_rows[i - 1]),
                      "gemmgen JIT runtime: bucket ", i, " of the op spec is incomplete or out of order");
    entry.bucket_rows.push_back(in.bucket_rows[i]);
    entry.bucket_launch.push_back(reinterpret_cast<gemmgen::LaunchFn>(in.bucket_launch[i]));
    entry.bucket_error_string.push_back(reinterpret_cast<gemmgen::ErrorStringFn>(in.bucket_error_string[i]));
    entry.bucket_kernel_names.emplace_back(in.bucket_kernel[i]);
  }
  for (const std::string& name : entry.bucket_kernel_names) entry.bucket_kernel.push_back(name.c_str());
  gemmgen::OpSpec& spec = entry.spec;
  spec.num_buckets = in.num_buckets;
  spec.bucket_rows = entry.bucket_rows.data();
  spec.bucket_launch = entry.bucket_launch.data();
  spec.bucket_error_string = entry.bucket_error_string.data();
  spec.bucket_kernel = entry.bucket_kernel.data();
}

void register_op(const JitOpSpec& in) {
  TORCH_CHECK_VALUE(in.ns && in.op && in.kernel && in.dtype && in.out_dtype && in.layout_a_flipped &&
                        in.layout_b_flipped && in.launch && in.error_string &&
                        (in.num_operands == 0 || in.operands),
                    "gemmgen JIT runtime: incomplete op spec");
  TORCH_CHECK_VALUE(in.num_operands >= 0 && in.num_operands <= GEMMGEN_MAX_EPILOGUE_OPERANDS,
                    "gemmgen JIT runtime: ", in.num_operands, " epilogue operands (at most ",
                    GEMMGEN_MAX_EPILOGUE_OPERANDS, ")");
  TORCH_CHECK_VALUE(in.device_type == static_cast<int>(c10::DeviceType::CUDA) ||
                        in.device_type == static_cast<int>(c10::DeviceType::CPU),
                    "gemmgen JIT runtime: device type ", in.device_type, " (CUDA or a CPU stand-in)");
  for (int i = 0; i < in.num_operands; ++i) {
    const JitOperandSpec& o = in.operands[i];
    TORCH_CHECK_VALUE(o.name && o.dtype && o.kind >= 0 && o.kind < gemmgen::kOperandKinds,
                      "gemmgen JIT runtime: operand ", i, " of the op spec is incomplete");
  }
  // Never freed: the dispatcher keeps pointers to the kernels (and they to the spec) until the process
  // ends, and a torch::Library destroyed at exit would deregister from a dispatcher that may be gone.
  auto* entry = new RegisteredOp{in.ns, in.op, in.kernel, in.dtype, in.out_dtype, in.layout_a_flipped,
                                 in.layout_b_flipped};
  gemmgen::OpSpec& spec = entry->spec;
  spec.ns = entry->ns.c_str();
  spec.op = entry->op.c_str();
  spec.kernel = entry->kernel.c_str();
  spec.arch = in.arch;
  spec.dtype = scalar_type(entry->dtype_name);
  spec.dtype_name = entry->dtype_name.c_str();
  spec.out_dtype = scalar_type(entry->out_dtype_name);
  spec.out_dtype_name = entry->out_dtype_name.c_str();
  spec.a_row = in.a_row != 0;
  spec.b_row = in.b_row != 0;
  spec.d_row = in.d_row != 0;
  spec.layout_a_flipped = entry->layout_a_flipped.c_str();
  spec.layout_b_flipped = entry->layout_b_flipped.c_str();
  spec.launch = reinterpret_cast<gemmgen::LaunchFn>(in.launch);
  spec.error_string = reinterpret_cast<gemmgen::ErrorStringFn>(in.error_string);
  entry->operand_names.reserve(in.num_operands);
  entry->operand_dtype_names.reserve(in.num_operands);
  for (int i = 0; i < in.num_operands; ++i) {
    entry->operand_names.emplace_back(in.operands[i].name);
    entry->operand_dtype_names.emplace_back(in.operands[i].dtype);
  }
  for (int i = 0; i < in.num_operands; ++i) {
    const JitOperandSpec& o = in.operands[i];
    entry->operands.push_back({static_cast<gemmgen::OperandKind>(o.kind), entry->operand_names[i].c_str(),
                               scalar_type(entry->operand_dtype_names[i]), entry->operand_dtype_names[i].c_str(),
                               o.row != 0});
  }
  spec.num_operands = in.num_operands;
  spec.operands = entry->operands.data();
  spec.aux = in.aux != 0;
  spec.quant_block = in.quant_block;
  spec.amax = in.amax != 0;
  spec.device_type = static_cast<c10::DeviceType>(in.device_type);
  if (in.dtype_b != nullptr) {
    entry->dtype_b_name = in.dtype_b;
    spec.dtype_b = scalar_type(entry->dtype_b_name);
    spec.dtype_b_name = entry->dtype_b_name.c_str();
  }
  if (in.grouped_refusal != nullptr && in.grouped_refusal[0] != '\0') {
    entry->grouped_refusal = in.grouped_refusal;
    spec.grouped_refusal = entry->grouped_refusal.c_str();
  }
  if (in.grouped_list_refusal != nullptr && in.grouped_list_refusal[0] != '\0') {
    entry->grouped_list_refusal = in.grouped_list_refusal;
    spec.grouped_list_refusal = entry->grouped_list_refusal.c_str();
  }
  copy_buckets(in, *entry);
  const bool boxed = gemmgen::has_epilogue_schema(spec);
  if (boxed) check_schema(*entry);
  entry->library = new torch::Library(torch::Library::IMPL, entry->ns, c10::DispatchKey::CUDA, __FILE__, __LINE__);
  if (boxed) {
    // The operands vary per op: boxed kernels, which read them off the stack as spec.operands says.
    entry->library->impl(entry->op.c_str(), gemmgen::epilogue_kernel(&spec));
    entry->library->impl((entry->op + ".out").c_str(), gemmgen::epilogue_out_kernel(&spec));
    // fp8 with per-block scales: grouped calls of rows with their scales (registration.py has_grouped_scaled)
    if (has_overload(entry->ns, entry->op, "grouped_scaled")) {
      entry->library->impl((entry->op + ".grouped_scaled").c_str(), gemmgen::GemmGroupedScaledKernel{&spec});
    }
    if (has_overload(entry->ns, entry->op, "masked_scaled")) {
      entry->library->impl((entry->op + ".masked_scaled").c_str(), gemmgen::GemmMaskedScaledKernel{&spec});
    }
  } else {
    entry->library->impl(entry->op.c_str(), gemmgen::GemmKernel{&spec});
    entry->library->impl((entry->op + ".out").c_str(), gemmgen::GemmOutKernel{&spec});
    if (has_overload(entry->ns, entry->op, "grouped")) {
      entry->library->impl((entry->op + ".grouped").c_str(), gemmgen::GemmGroupedKernel{&spec});
    }
    if (has_overload(entry->ns, entry->op, "grouped_list")) {
      entry->library->impl((entry->op + ".grouped_list").c_str(), gemmgen::GemmGroupedListKernel{&spec});
    }
    if (has_overload(entry->ns, entry->op, "masked")) {
      entry->library->impl((entry->op + ".masked").c_str(), gemmgen::GemmMaskedKernel{&spec});
    }
  }
}

// What generator/runtime/jit_runtime.py passes for one op's autograd formula (its mirror is JitAutogradSpec).
struct JitAutogradSpec {
  const char* ns;
  const char* op;
  const char* dtype;      // of A and B: "fp16" | "bf16"
  const char* grad_a[2];  // per storage order of dD (row, col): the op computing dA
  const char* grad_b[2];  // and dB
  int grad_a_b_row[2];    // the storage order in which grad_a takes B.t(): 1 = row-major (B where transposed)
  int grad_b_a_row[2];    // and grad_b A.t() (A where transposed)
  int grad_a_transposed[2];  // 1: grad_a computes dA.t() (gemm_autograd.h AutogradSpec)
  int grad_b_transposed[2];  // and grad_b dB.t()
  // An op whose epilogue is a Linear layer's, activation(acc + bias) (gemm_autograd.h LinearEpilogueSpec); all
  // zero or null for a plain op.
  int activation;            // gemmgen::Activation
  const char* bias;          // the per-column operand's name, or null
  const char* saving;        // the op also writing acc, or null
  const char* accumulator;   // the plain fp32 op recomputing acc, or null
};

struct RegisteredAutograd {
  std::string ns, op, grad_a[2], grad_b[2], bias, saving, accumulator;
  gemmgen::AutogradSpec spec{};
  gemmgen::LinearEpilogueSpec epilogue{};
  torch::Library* library = nullptr;
};

// A Linear layer's epilogue formula for the default overload (.out keeps Python's refusal of grad: its schema
// differs per epilogue).
void register_linear_epilogue(const JitAutogradSpec& in, RegisteredAutograd& entry) {
  TORCH_CHECK_VALUE(in.activation >= 0 && in.activation <= static_cast<int>(gemmgen::Activation::Silu),
                    "gemmgen JIT runtime: activation ", in.activation, " (0-4)");
  const auto activation = static_cast<gemmgen::Activation>(in.activation);
  TORCH_CHECK_VALUE((activation == gemmgen::Activation::None) == (in.accumulator == nullptr),
                    "gemmgen JIT runtime: an activation needs its accumulator op, and only an activation has one");
  gemmgen::LinearEpilogueSpec& spec = entry.epilogue;
  spec.product = &entry.spec;
  spec.activation = activation;
  if (in.bias) spec.bias = (entry.bias = in.bias).c_str();
  if (in.saving) spec.saving = (entry.saving = in.saving).c_str();
  if (in.accumulator) spec.accumulator = (entry.accumulator = in.accumulator).c_str();
  if (spec.bias) {
    entry.library->impl(entry.op.c_str(), gemmgen::BiasEpilogueAutogradKernel{&spec});
  } else {
    entry.library->impl(entry.op.c_str(), gemmgen::ActivationEpilogueAutogradKernel{&spec});
  }
}

void register_autograd(const JitAutogradSpec& in) {
  TORCH_CHECK_VALUE(in.ns && in.op && in.dtype && in.grad_a[0] && in.grad_a[1] && in.grad_b[0] && in.grad_b[1],
                    "gemmgen JIT runtime: incomplete autograd spec");
  // Never freed, as the kernels' specs (see register_op).
  auto* entry = new RegisteredAutograd{in.ns, in.op, {in.grad_a[0], in.grad_a[1]}, {in.grad_b[0], in.grad_b[1]}};
  gemmgen::AutogradSpec& spec = entry->spec;
  spec.ns = entry->ns.c_str();
  spec.op = entry->op.c_str();
  spec.dtype = scalar_type(in.dtype);
  for (int order = 0; order < 2; ++order) {
    spec.grad_a[order] = entry->grad_a[order].c_str();
    spec.grad_b[order] = entry->grad_b[order].c_str();
    spec.grad_a_b_row[order] = in.grad_a_b_row[order] != 0;
    spec.grad_b_a_row[order] = in.grad_b_a_row[order] != 0;
    spec.grad_a_transposed[order] = in.grad_a_transposed[order] != 0;
    spec.grad_b_transposed[order] = in.grad_b_transposed[order] != 0;
  }
  entry->library = new torch::Library(torch::Library::IMPL, entry->ns, c10::DispatchKey::Autograd, __FILE__, __LINE__);
  if (in.activation != 0 || in.bias != nullptr) {
    register_linear_epilogue(in, *entry);
    return;
  }
  entry->library->impl(entry->op.c_str(), gemmgen::GemmAutogradKernel{&spec});
  entry->library->impl((entry->op + ".out").c_str(), gemmgen::GemmOutAutogradKernel{&spec});
  // Not .grouped and .grouped_list: their formulas are Python's (generator/runtime/autograd.py,
  // _register_grouped_formulas), registered for JIT ops whichever formula the default overload has.
}

// Runs one registration; 0, or 1 with the reason in error (NUL-terminated, truncated to error_size).
template <class Registration>
int report_errors(Registration&& registration, char* error, size_t error_size) {
  try {
    registration();
    return 0;
  } catch (const c10::Error& e) {
    std::strncpy(error, e.what_without_backtrace(), error_size);
  } catch (const std::exception& e) {
    std::strncpy(error, e.what(), error_size);
  }
  if (error_size > 0) error[error_size - 1] = '\0';
  return 1;
}

}  // namespace

extern "C" {

// Registers the CUDA kernels of torch.ops.<ns>.<op>, .out and (a plain op's) .grouped and .grouped_list (the schemas
// must be defined already).
// Returns 0, or 1 with the reason in error (NUL-terminated, truncated to error_size).
__attribute__((visibility("default"))) int gemmgen_register_cuda_kernels(const JitOpSpec* spec, char* error,
                                                                          size_t error_size) {
  return report_errors(
      [spec] {
        TORCH_CHECK_VALUE(spec != nullptr, "gemmgen JIT runtime: no op spec");
        register_op(*spec);
      },
      error, error_size);
}

// Registers the Autograd kernels of torch.ops.<ns>.<op> (the formula) and .out (refuses grad), as
// gemmgen_register_cuda_kernels does the CUDA ones (.grouped and .grouped_list: Python registers their formulas).
__attribute__((visibility("default"))) int gemmgen_register_autograd(const JitAutogradSpec* spec, char* error,
                                                                      size_t error_size) {
  return report_errors(
      [spec] {
        TORCH_CHECK_VALUE(spec != nullptr, "gemmgen JIT runtime: no autograd spec");
        register_autograd(*spec);
      },
      error, error_size);
}

}  // extern "C"
