"""gemmgen: plan GEMM kernels for a GPU, render them from Jinja templates, build them with ninja
and call them as torch ops.

    from generator import Gemm
    plan = Gemm(dtype="bf16", layout="tn")
    plan.activation, plan.bias = "gelu_tanh", "col"   # a fused epilogue (or Gemm(..., epilogue=fn), see epilogue)
    op = plan.compile()
    D = op(A, B, b)     # also torch.ops.gemmgen.<plan.name>(A, B, b)
    plan.emit("emitted/my_gemms")   # a pip-installable package; or emit([plan, ...], name=..., out=...)

Planning, rendering and emitting need neither torch nor a GPU; ``compile`` needs torch and nvcc.
"""
from . import epilogue
from .emit import emit
from .gemm import Gemm
from .render import render
from .spec.config import KernelConfig, check_config
from .spec.types import DType, Layout, Order

__all__ = ["Gemm", "KernelConfig", "check_config", "emit", "epilogue", "render", "DType", "Layout", "Order", "quantize",
           "dequantize"]


def __getattr__(name: str) -> object:
    # quantize and dequantize need torch, which planning does not: imported on first use.
    if name in ("quantize", "dequantize"):
        from . import quantization
        return getattr(quantization, name)
    raise AttributeError(f"module 'generator' has no attribute {name!r}")
