// The autograd formula of a gemmgen op, as dispatcher kernels for the Autograd key (see gemm_op.h for
// the rest of an op). Included by gemmgen's JIT runtime and by the bindings of packages emitted with
// autograd.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/threshold_backward.h>
#include <torch/csrc/autograd/custom_function.h>

#include "torch/gemm_op.h"

// Hidden, as gemm_op.h's namespace (and for the same reason).
namespace __attribute__((visibility("hidden"))) gemmgen {

// -- autograd ----------------------------------------------------------------------------------------
//
// gemmgen's formula (generator/runtime/autograd.py, generator/planner/backward.py): dA = dD @ B.t() and dB = A.t() @ dD,
// each by another op of the same namespace whose layouts take the operands as they are stored. There is
// one pair of ops per storage order of dD; a dD in neither order (the expanded gradient of out.sum())
// is copied to row-major first, and one of another dtype (an fp32 output's) is cast to the inputs'.
// Those ops carry this formula too, so double backward works. In C++ so that a call that needs no
// gradient (inference, no_grad) costs one branch here rather than a trip through Python.

using GemmSignature = at::Tensor(const at::Tensor&, const at::Tensor&);
using GemmOutSignature = at::Tensor&(const at::Tensor&, const at::Tensor&, at::Tensor&);

// What the formula needs to know about one op. Index 0 of each pair: a row-major dD; 1: column-major.
struct AutogradSpec {
  const char* ns;             // the op's namespace: torch.ops.<ns>.<op>
  const char* op;             // the op's name in that namespace
  c10::ScalarType dtype;      // of A and B: a gradient of another dtype is cast to it
  const char* grad_a[2];      // the op computing dA = dD @ B.t()
  const char* grad_b[2];      // the op computing dB = A.t() @ dD
  bool grad_a_b_row[2];       // the storage order in which grad_a takes B.t() (true = row-major); B where transposed
  bool grad_b_a_row[2];       // the storage order in which grad_b takes A.t(); A where transposed
  // Whether grad_a (grad_b) computes dA.t() = B @ dD.t() (dB.t() = dD.t() @ A) into row-major storage, the bytes of
  // a column-major dA (dB): generator/planner/backward.py writes_transposed.
  bool grad_a_transposed[2];
  bool grad_b_transposed[2];
  // The op's own handles, found on first use (the schemas may be defined after this is registered).
  mutable std::once_flag found;
  mutable std::optional<c10::TypedOperatorHandle<GemmSignature>> self;
  mutable std::optional<c10::TypedOperatorHandle<GemmOutSignature>> self_out;
};

template <class Signature>
inline c10::TypedOperatorHandle<Signature> find_op(const char* ns, const char* name, const char* overload) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow((std::string(ns) + "::" + name).c_str(), overload)
      .template typed<Signature>();
}

inline const AutogradSpec& found(const AutogradSpec& spec) {
  std::call_once(spec.found, [&spec] {
    spec.self = find_op<GemmSignature>(spec.ns, spec.op, "");
    spec.self_out = find_op<GemmOutSignature>(spec.ns, spec.op, "out");
  });
  return spec;
}

// t itself when it is stored in the order (any leading dimension), else a copy that is.
inline at::Tensor in_order(const at::Tensor& t, bool row) {
  if (stored_in(t, row)) return t;
  return row ? t.contiguous() : t.t().contiguous().t();
}

// dA = dD @ B.t() and dB = A.t() @ dD (each only where needed) on the spec's backward ops: dD cast to the inputs'
// dtype and taken in the order it is stored (copied to row-major where it is in neither).
inline std::pair<at::Tensor, at::Tensor> product_grads(const AutogradSpec& spec, const at::Tensor& A,
                                                       const at::Tensor& B, at::Tensor grad, bool need_a,
                                                       bool need_b) {
  if (grad.scalar_type() != spec.dtype) grad = grad.to(spec.dtype);
  int order = stored_in(grad, true) ? 0 : 1;
  if (order == 1 && !stored_in(grad, false)) {
    grad = grad.contiguous();
    order = 0;
  }
  at::Tensor grad_a, grad_b;
  if (need_a) {
    const auto op = find_op<GemmSignature>(spec.ns, spec.grad_a[order], "");
    grad_a = spec.grad_a_transposed[order] ? op.call(in_order(B, spec.grad_a_b_row[order]), grad.t()).t()
                                           : op.call(grad, in_order(B.t(), spec.grad_a_b_row[order]));
  }
  if (need_b) {
    const auto op = find_op<GemmSignature>(spec.ns, spec.grad_b[order], "");
    grad_b = spec.grad_b_transposed[order] ? op.call(grad.t(), in_order(A, spec.grad_b_a_row[order])).t()
                                           : op.call(in_order(A.t(), spec.grad_b_a_row[order]), grad);
  }
  return {grad_a, grad_b};
}

// torch::autograd::Function for one call of an op; the spec travels as an integer (saved_data holds IValues).
struct GemmFunction : public torch::autograd::Function<GemmFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& A, const at::Tensor& B,
                            int64_t spec_address) {
    ctx->saved_data["spec"] = spec_address;
    ctx->save_for_backward({A, B});
    const auto& spec = *reinterpret_cast<const AutogradSpec*>(spec_address);
    at::AutoDispatchBelowADInplaceOrView below;
    return found(spec).self->call(A, B);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto& spec = *reinterpret_cast<const AutogradSpec*>(ctx->saved_data["spec"].toInt());
    const auto saved = ctx->get_saved_variables();
    auto [grad_a, grad_b] = product_grads(spec, saved[0], saved[1], grads[0], ctx->needs_input_grad(0),
                                          ctx->needs_input_grad(1));
    return {grad_a, grad_b, at::Tensor()};
  }
};

// A batched call (3-D A or B) has no formula yet (GemmFunction is A @ B's for 2-D operands): one that needs a
// gradient is refused at the call, in generator/runtime/autograd.py's words (refuse_batched_grad).
// operand, operand_name: an epilogue operand that may require grad too (a Linear layer's bias), named in the message.
inline void refuse_batched_grad(const AutogradSpec& spec, const at::Tensor& A, const at::Tensor& B,
                                const at::Tensor& operand = {}, const char* operand_name = nullptr) {
  const bool batched = (A.defined() && A.dim() == 3) || (B.defined() && B.dim() == 3);
  if (!batched) return;
  std::string wanting;
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&A, "A"}, {&B, "B"}, {&operand, operand_name}}) {
    if (t->defined() && t->requires_grad()) wanting += (wanting.empty() ? "" : ", ") + std::string(name);
  }
  TORCH_CHECK(false, spec.op, ": batched calls (3-D A or B) have no backward pass yet, but ", wanting,
              " require(s) grad: call it under torch.no_grad() or with detached tensors, or call it once per problem "
              "with 2-D tensors");
}

// The Autograd kernel of the default overload: straight to the kernel when no gradient is wanted.
struct GemmAutogradKernel {
  const AutogradSpec* spec;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B) const {
    if (!at::GradMode::is_enabled() || !(A.requires_grad() || B.requires_grad())) {
      at::AutoDispatchBelowADInplaceOrView below;
      return found(*spec).self->call(A, B);
    }
    refuse_batched_grad(*spec, A, B);
    return GemmFunction::apply(A, B, reinterpret_cast<int64_t>(spec));
  }
};

// .out, as aten's out= ops: not differentiable, and said so at the call rather than at backward().
struct GemmOutAutogradKernel {
  const AutogradSpec* spec;
  at::Tensor& operator()(const at::Tensor& A, const at::Tensor& B, at::Tensor& out) const {
    TORCH_CHECK(!(at::GradMode::is_enabled() && (A.requires_grad() || B.requires_grad() || out.requires_grad())),
                spec->op, kOutNotDifferentiable);
    at::AutoDispatchBelowAutograd below;
    return found(*spec).self_out->call(A, B, out);
  }
};

// -- a Linear layer's epilogue: D = activation(acc + bias) -------------------------------------------
//
// The closed form of generator/runtime/autograd.py's _bias_activation_backward (Epilogue.bias_activation, either
// part optional): the activation's derivative at acc + bias in the saved acc's dtype, D's (torch's one-kernel
// *_backward ops, as torch's autograd of Linear + GELU takes it at the Linear's output; fp32 where acc is
// recomputed), the bias's gradient the fp32 sum of the columns, dA and dB by product_grads. In C++ for
// the plain formula's reasons, and because the Python autograd.Function held a host-bound MLP stack's training step
// at 0.68x stock (0.91x with this one, docs/epilogue.md "Autograd, measured").

// The activations, as generator/runtime/jit_runtime.py's ACTIVATION_CODES numbers them.
enum class Activation : int { None = 0, Relu = 1, Gelu = 2, GeluTanh = 3, Silu = 4 };

using BiasSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&);
using SavingSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&);
using BiasSavingSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                const at::Tensor&);

struct LinearEpilogueSpec {
  const AutogradSpec* product;  // the op's names and its dA and dB ops, as the plain formula's
  Activation activation;
  const char* bias;             // the per-column operand's name in the schema; null: none
  // The same kernel also writing acc (planner/backward.py saving_config), whose derivative the activation reads;
  // null where none is saved: no activation, or relu (its kink: acc is recomputed in fp32).
  const char* saving;
  // The plain fp32 op recomputing acc (accumulator_config): relu's, and every activation's under create_graph (its
  // own formula keeps the second derivative connected to A and B); null without an activation.
  const char* accumulator;
  // The op's and the saving op's handles, found on first use, as AutogradSpec's (one of each pair is used).
  mutable std::once_flag found;
  mutable std::optional<c10::TypedOperatorHandle<BiasSignature>> self_bias;
  mutable std::optional<c10::TypedOperatorHandle<SavingSignature>> saving_op;
  mutable std::optional<c10::TypedOperatorHandle<BiasSavingSignature>> saving_op_bias;
};

inline const LinearEpilogueSpec& found(const LinearEpilogueSpec& spec) {
  std::call_once(spec.found, [&spec] {
    const char* ns = spec.product->ns;
    if (spec.bias) spec.self_bias = find_op<BiasSignature>(ns, spec.product->op, "");
    if (spec.saving && spec.bias) spec.saving_op_bias = find_op<BiasSavingSignature>(ns, spec.saving, "");
    if (spec.saving && !spec.bias) spec.saving_op = find_op<SavingSignature>(ns, spec.saving, "");
  });
  return spec;
}

// D of one call (and acc where save and the spec saves it), below autograd.
inline std::pair<at::Tensor, at::Tensor> run_linear_epilogue(const LinearEpilogueSpec& spec, const at::Tensor& A,
                                                             const at::Tensor& B, const at::Tensor& bias,
                                                             bool save) {
  at::AutoDispatchBelowADInplaceOrView below;
  found(spec);
  if (save && spec.saving != nullptr) {
    auto [out, acc] = spec.bias ? spec.saving_op_bias->call(A, B, bias) : spec.saving_op->call(A, B);
    return {out, acc};
  }
  if (spec.bias) return {spec.self_bias->call(A, B, bias), at::Tensor()};
  return {found(*spec.product).self->call(A, B), at::Tensor()};
}

// d(loss)/d(pre) of activation(pre), from d(loss)/d(activation), both in pre's dtype.
inline at::Tensor activation_backward(Activation activation, const at::Tensor& grad, const at::Tensor& pre) {
  switch (activation) {
    case Activation::Relu: return at::threshold_backward(grad, pre, 0);
    case Activation::Gelu: return at::gelu_backward(grad, pre, "none");
    case Activation::GeluTanh: return at::gelu_backward(grad, pre, "tanh");
    case Activation::Silu: return at::silu_backward(grad, pre);
    case Activation::None: break;
  }
  return grad;
}

struct LinearEpilogueFunction : public torch::autograd::Function<LinearEpilogueFunction> {
  // bias: the bias, or none where the spec has none (a list: Function::apply takes no undefined tensor).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& A, const at::Tensor& B,
                            at::TensorList bias_list, int64_t spec_address) {
    const auto& spec = *reinterpret_cast<const LinearEpilogueSpec*>(spec_address);
    ctx->saved_data["spec"] = spec_address;
    ctx->set_materialize_grads(false);
    const at::Tensor bias = bias_list.empty() ? at::Tensor() : bias_list[0];
    auto [out, acc] = run_linear_epilogue(spec, A, B, bias, true);
    ctx->save_for_backward({A, B, bias, acc});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto& spec = *reinterpret_cast<const LinearEpilogueSpec*>(ctx->saved_data["spec"].toInt());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &A = saved[0], &B = saved[1], &bias = saved[2], &acc = saved[3];
    // One gradient per input: A, B, the bias where there is one, the spec.
    torch::autograd::variable_list result(bias.defined() ? 4 : 3);
    if (!grads[0].defined()) return result;
    at::Tensor grad_acc = grads[0];
    if (spec.activation != Activation::None) {
      // Grad mode is on here only for backward(create_graph=True): then acc is recomputed with a graph.
      at::Tensor pre = at::GradMode::is_enabled() || !acc.defined()
                           ? find_op<GemmSignature>(spec.product->ns, spec.accumulator, "").call(A, B)
                           : acc;
      if (bias.defined()) pre = pre.add(bias.to(pre.scalar_type()));
      grad_acc = activation_backward(spec.activation, grads[0].to(pre.scalar_type()), pre);
    }
    if (bias.defined() && ctx->needs_input_grad(2)) {
      result[2] = grad_acc.sum(0, false, at::kFloat).to(bias.scalar_type());
    }
    std::tie(result[0], result[1]) = product_grads(*spec.product, A, B, grad_acc, ctx->needs_input_grad(0),
                                                   ctx->needs_input_grad(1));
    return result;
  }
};

inline at::Tensor linear_epilogue_autograd(const LinearEpilogueSpec& spec, const at::Tensor& A, const at::Tensor& B,
                                           const at::Tensor& bias) {
  const bool wanted = A.requires_grad() || B.requires_grad() || (bias.defined() && bias.requires_grad());
  if (!at::GradMode::is_enabled() || !wanted) return run_linear_epilogue(spec, A, B, bias, false).first;
  refuse_batched_grad(*spec.product, A, B, bias, spec.bias);
  const auto bias_list = bias.defined() ? std::vector<at::Tensor>{bias} : std::vector<at::Tensor>{};
  return LinearEpilogueFunction::apply(A, B, at::TensorList(bias_list), reinterpret_cast<int64_t>(&spec));
}

// The Autograd kernel of an op computing activation(acc + bias) (schema (A, B, bias)).
struct BiasEpilogueAutogradKernel {
  const LinearEpilogueSpec* spec;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B, const at::Tensor& bias) const {
    return linear_epilogue_autograd(*spec, A, B, bias);
  }
};

// And of one computing activation(acc) (schema (A, B)).
struct ActivationEpilogueAutogradKernel {
  const LinearEpilogueSpec* spec;
  at::Tensor operator()(const at::Tensor& A, const at::Tensor& B) const {
    return linear_epilogue_autograd(*spec, A, B, at::Tensor());
  }
};

}  // namespace gemmgen
