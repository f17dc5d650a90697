// The autograd formula of a gemmgen op, as dispatcher kernels for the Autograd key (see gemm_op.h for
// the rest of an op). Included by gemmgen's JIT runtime and by the bindings of packages emitted with
// autograd.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
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
    const at::Tensor &A = saved[0], &B = saved[1];
    at::Tensor grad = grads[0];
    if (grad.scalar_type() != spec.dtype) grad = grad.to(spec.dtype);
    int order = stored_in(grad, true) ? 0 : 1;
    if (order == 1 && !stored_in(grad, false)) {
      grad = grad.contiguous();
      order = 0;
    }
    at::Tensor grad_a, grad_b;
    if (ctx->needs_input_grad(0)) {
      const auto op = find_op<GemmSignature>(spec.ns, spec.grad_a[order], "");
      grad_a = spec.grad_a_transposed[order] ? op.call(in_order(B, spec.grad_a_b_row[order]), grad.t()).t()
                                             : op.call(grad, in_order(B.t(), spec.grad_a_b_row[order]));
    }
    if (ctx->needs_input_grad(1)) {
      const auto op = find_op<GemmSignature>(spec.ns, spec.grad_b[order], "");
      grad_b = spec.grad_b_transposed[order] ? op.call(grad.t(), in_order(A, spec.grad_b_a_row[order])).t()
                                             : op.call(in_order(A.t(), spec.grad_b_a_row[order]), grad);
    }
    return {grad_a, grad_b, at::Tensor()};
  }
};

// A batched call (3-D A or B) has no formula yet (GemmFunction is A @ B's for 2-D operands): one that needs a
// gradient is refused at the call, in generator/runtime/autograd.py's words (refuse_batched_grad).
inline void refuse_batched_grad(const AutogradSpec& spec, const at::Tensor& A, const at::Tensor& B) {
  const bool batched = (A.defined() && A.dim() == 3) || (B.defined() && B.dim() == 3);
  if (!batched) return;
  const bool a = A.defined() && A.requires_grad(), b = B.defined() && B.requires_grad();
  TORCH_CHECK(false, spec.op, ": batched calls (3-D A or B) have no backward pass yet, but ",
              a && b ? "A, B" : a ? "A" : "B", " require(s) grad: call it under torch.no_grad() or with detached "
              "tensors, or call it once per problem with 2-D tensors");
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

}  // namespace gemmgen
