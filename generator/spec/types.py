"""Data types and operand layouts, spelled the way users and kernels spell them.

Nothing here imports torch: planning and rendering must work on a machine without it.
A torch dtype is accepted by looking at its printed name (``torch.bfloat16`` -> ``"bfloat16"``).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class DType(Enum):
    """Element types the kernels know. The value is the short name used in kernel names."""

    fp16 = "fp16"
    bf16 = "bf16"
    fp32 = "fp32"
    tf32 = "tf32"   # inputs only: fp32 tensors, multiplied on the tensor cores in tf32 (10-bit mantissa)
    e4m3 = "e4m3"   # fp8, 4 exponent and 3 mantissa bits (torch.float8_e4m3fn); inputs only
    e5m2 = "e5m2"   # fp8, 5 exponent and 2 mantissa bits (torch.float8_e5m2); inputs only
    int8 = "int8"   # inputs only; products accumulate in int32
    int32 = "int32"  # outputs only: the exact accumulator of an int8 GEMM

    @property
    def bytes(self) -> int:
        return _BYTES[self.value]

    @property
    def cuda_type(self) -> str:
        """The C++ type of one element in the generated code."""
        return _CUDA_TYPES[self.value]

    @property
    def torch_name(self) -> str:
        return _TORCH_NAMES[self.value]

    @property
    def is_fp8(self) -> bool:
        return self in (DType.e4m3, DType.e5m2)

    @property
    def is_quantized(self) -> bool:
        """fp8 and int8: GEMMs of quantized operands, which have no gradient formula (forward only)."""
        return self.is_fp8 or self is DType.int8


_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "tf32": 4, "e4m3": 1, "e5m2": 1, "int8": 1, "int32": 4}
_CUDA_TYPES = {"fp16": "__half", "bf16": "__nv_bfloat16", "fp32": "float", "tf32": "float",
               "e4m3": "__nv_fp8_e4m3", "e5m2": "__nv_fp8_e5m2", "int8": "int8_t", "int32": "int32_t"}
_TORCH_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "tf32": "float32",
                "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "int8": "int8", "int32": "int32"}


# Every spelling a user may pass, mapped to one DType. Torch dtypes arrive as their str().
_DTYPE_ALIASES = {
    "fp16": DType.fp16, "float16": DType.fp16, "half": DType.fp16, "f16": DType.fp16,
    "bf16": DType.bf16, "bfloat16": DType.bf16,
    "fp32": DType.fp32, "float32": DType.fp32, "float": DType.fp32, "f32": DType.fp32,
    "tf32": DType.tf32,
    "e4m3": DType.e4m3, "fp8_e4m3": DType.e4m3, "float8_e4m3fn": DType.e4m3, "fp8": DType.e4m3,
    "e5m2": DType.e5m2, "fp8_e5m2": DType.e5m2, "float8_e5m2": DType.e5m2,
    "int8": DType.int8, "s8": DType.int8, "i8": DType.int8,
    "int32": DType.int32, "s32": DType.int32, "i32": DType.int32,
}

#: Input dtypes of the shipped kernels and of every family and layout.
INPUT_DTYPES = (DType.fp16, DType.bf16)
#: Every input dtype a plan takes: also tf32 and fp8 (see spec/config.py check_tf32, check_fp8).
PLANNABLE_INPUT_DTYPES = (DType.fp16, DType.bf16, DType.tf32, DType.e4m3, DType.e5m2, DType.int8)
#: Element types of D and of an epilogue's tensor operands.
OUTPUT_DTYPES = (DType.fp16, DType.bf16, DType.fp32)
#: A D quantized on the way out: fp8 with per-block scales, a second output (spec/config.py check_quantized_out).
QUANTIZED_OUTPUT_DTYPES = (DType.e4m3, DType.e5m2)
#: Every D a plan may write: also int32, the exact sums of an int8 GEMM (see spec/config.py check_int8), and fp8.
PLAN_OUTPUT_DTYPES = (*OUTPUT_DTYPES, DType.int32, *QUANTIZED_OUTPUT_DTYPES)


def unquantized(out_dtype: DType) -> DType:
    """The dtype D's values have before they are quantized (the epilogue's operands "like the output" take it): bf16
    for an fp8 D, D's own otherwise."""
    return DType.bf16 if out_dtype in QUANTIZED_OUTPUT_DTYPES else out_dtype


def default_out_dtype(dtype: DType) -> DType:
    """D's dtype when the plan names none: the input's for 16-bit types, fp32 for tf32 (fp32 tensors in, fp32
    out), bf16 for fp8 (as DeepGEMM and the scaled-mm users of torch write), int32 for int8 (exact)."""
    if dtype in OUTPUT_DTYPES:
        return dtype
    return {DType.tf32: DType.fp32, DType.int8: DType.int32}.get(dtype, DType.bf16)


def parse_input_dtype(value: object) -> DType:
    """The input dtype of a plan: as parse_dtype, and fp32 (``torch.float32``, "float32") means tf32: fp32 tensors
    multiplied on the tensor cores, which take them as tf32."""
    dtype = parse_dtype(value, allowed=(*PLANNABLE_INPUT_DTYPES, DType.fp32))
    return DType.tf32 if dtype is DType.fp32 else dtype


def parse_dtype(value: object, *, what: str = "dtype", allowed: tuple[DType, ...] = INPUT_DTYPES) -> DType:
    """Turn ``torch.bfloat16``, ``"bf16"``, ``"bfloat16"`` or a DType into a DType, or raise ValueError."""
    if isinstance(value, DType):
        dtype = value
    else:
        text = str(value).removeprefix("torch.").lower()
        dtype = _DTYPE_ALIASES.get(text)
        if dtype is None:
            choices = ", ".join(f"'{d.value}'" for d in allowed)
            raise ValueError(f"{what}={value!r} is not a data type this generator knows; use one of {choices} "
                             f"(or the matching torch dtype)")
    if dtype not in allowed:
        choices = ", ".join(f"'{d.value}'" for d in allowed)
        raise ValueError(f"{what}={dtype.value!r} is not supported here; supported: {choices}")
    return dtype


class Order(Enum):
    """Storage order of one matrix operand."""

    row = "row"  # the last index is contiguous (torch's default)
    col = "col"  # the first index is contiguous (a transposed view of a contiguous tensor)


def parse_order(value: object, *, what: str) -> Order:
    if isinstance(value, Order):
        return value
    try:
        return Order(str(value).lower())
    except ValueError:
        raise ValueError(f"{what}={value!r} is not a storage order; use 'row' or 'col'") from None


LAYOUTS = ("nn", "nt", "tn", "tt")


@dataclass(frozen=True)
class Layout:
    """Storage of A (M x K), B (K x N) and D (M x N).

    The two-letter BLAS spelling names A then B in column-major (BLAS) terms:
    'n' = stored as is in column-major, 't' = stored transposed, i.e. row-major.
    So 'tn' is A row-major (K contiguous) and B column-major (K contiguous): torch's
    ``x @ W.t()`` for an ``nn.Linear`` weight W of shape (N, K). D is row-major unless c='col'.
    """

    a: Order
    b: Order
    c: Order = Order.row

    @property
    def blas(self) -> str:
        letter = {Order.row: "t", Order.col: "n"}
        return letter[self.a] + letter[self.b]

    @property
    def tag(self) -> str:
        """The layout as it appears in kernel names: 'tn', or 'tn_dcol' for a column-major D."""
        return self.blas + ("_dcol" if self.c is Order.col else "")

    @property
    def a_k_major(self) -> bool:
        return self.a is Order.row

    @property
    def b_k_major(self) -> bool:
        return self.b is Order.col

    def transposed(self) -> Layout:
        """The layout of P.t() = R.t() @ L.t() for a product P = L @ R of this layout: each operand's order flips as
        it is transposed, and P.t() of a column-major P is row-major. Its own inverse."""
        flip = {Order.row: Order.col, Order.col: Order.row}
        return Layout(a=flip[self.b], b=flip[self.a], c=flip[self.c])


def parse_layout(layout: object = None, *, layout_a: object = None, layout_b: object = None,
                 layout_c: object = None) -> Layout:
    """Combine the 'tn'-style string with explicit per-operand orders (explicit ones win)."""
    a, b = Order.row, Order.col  # 'tn' is the default: torch's x @ W.t()
    if layout is not None:
        if isinstance(layout, Layout):
            a, b, c0 = layout.a, layout.b, layout.c
            layout_c = layout_c if layout_c is not None else c0
        else:
            text = str(layout).lower()
            if text not in LAYOUTS:
                raise ValueError(f"layout={layout!r} is not one of {', '.join(repr(x) for x in LAYOUTS)} "
                                 "(first letter A, second B; 't' = row-major, 'n' = column-major)")
            a = Order.row if text[0] == "t" else Order.col
            b = Order.row if text[1] == "t" else Order.col
    if layout_a is not None:
        a = parse_order(layout_a, what="layout_a")
    if layout_b is not None:
        b = parse_order(layout_b, what="layout_b")
    c = parse_order(layout_c, what="layout_c") if layout_c is not None else Order.row
    return Layout(a, b, c)
