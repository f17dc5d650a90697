"""Data types and layouts: every spelling a user may pass, and the messages for the ones we refuse."""
from __future__ import annotations

import pytest

from generator.spec.types import (
    INPUT_DTYPES,
    LAYOUTS,
    OUTPUT_DTYPES,
    DType,
    Layout,
    Order,
    parse_dtype,
    parse_layout,
    parse_order,
)

# -- parse_dtype --------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    ("fp16", DType.fp16), ("bf16", DType.bf16),
    ("float16", DType.fp16), ("bfloat16", DType.bf16), ("half", DType.fp16),
    ("FP16", DType.fp16), ("BF16", DType.bf16),
    # torch dtypes are read through their str(), so the planner needs no torch
    ("torch.float16", DType.fp16), ("torch.bfloat16", DType.bf16),
    (DType.bf16, DType.bf16),
])
def test_parse_dtype_spellings(value: object, expected: DType) -> None:
    assert parse_dtype(value) is expected


class _FakeTorchDtype:
    """Stands in for a torch.dtype: parse_dtype only looks at str()."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


def test_parse_dtype_reads_str_of_an_object() -> None:
    assert parse_dtype(_FakeTorchDtype("bfloat16")) is DType.bf16
    assert parse_dtype(_FakeTorchDtype("float16")) is DType.fp16


def test_parse_dtype_real_torch_dtypes() -> None:
    torch = pytest.importorskip("torch")
    assert parse_dtype(torch.bfloat16) is DType.bf16
    assert parse_dtype(torch.float16) is DType.fp16
    assert parse_dtype(torch.float32, what="out_dtype", allowed=OUTPUT_DTYPES) is DType.fp32
    with pytest.raises(ValueError, match="not supported here"):
        parse_dtype(torch.float32)


@pytest.mark.parametrize("value", ["int4", "torch.int16", "fp6", "", "bfloat", 3])
def test_parse_dtype_unknown_lists_choices(value: object) -> None:
    with pytest.raises(ValueError) as err:
        parse_dtype(value)
    msg = str(err.value)
    assert f"dtype={value!r} is not a data type this generator knows" in msg
    assert "use one of 'fp16', 'bf16'" in msg
    assert "torch dtype" in msg


def test_parse_dtype_known_but_not_allowed() -> None:
    with pytest.raises(ValueError) as err:
        parse_dtype("fp32")
    assert str(err.value) == "dtype='fp32' is not supported here; supported: 'fp16', 'bf16'"


def test_parse_dtype_message_names_the_argument() -> None:
    with pytest.raises(ValueError, match=r"^out_dtype='int4' .*'fp16', 'bf16', 'fp32'"):
        parse_dtype("int4", what="out_dtype", allowed=OUTPUT_DTYPES)
    assert parse_dtype("fp32", what="out_dtype", allowed=OUTPUT_DTYPES) is DType.fp32


def test_dtype_properties() -> None:
    assert INPUT_DTYPES == (DType.fp16, DType.bf16)
    assert [d.bytes for d in (DType.fp16, DType.bf16, DType.fp32)] == [2, 2, 4]
    assert DType.bf16.cuda_type == "__nv_bfloat16"
    assert DType.fp16.cuda_type == "__half"
    assert DType.fp32.cuda_type == "float"
    assert DType.bf16.torch_name == "bfloat16"


# -- parse_layout -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, a, b", [
    # first letter A, second B; 't' = row-major (transposed in BLAS's column-major terms), 'n' = column-major
    ("tn", Order.row, Order.col),
    ("nt", Order.col, Order.row),
    ("nn", Order.col, Order.col),
    ("tt", Order.row, Order.row),
    ("TN", Order.row, Order.col),
])
def test_parse_layout_letters(text: str, a: Order, b: Order) -> None:
    layout = parse_layout(text)
    assert (layout.a, layout.b, layout.c) == (a, b, Order.row)
    assert layout.blas == text.lower()


def test_tn_is_torch_linear() -> None:
    """'tn' = A (M x K) row-major, B (K x N) column-major: x @ W.t() for an nn.Linear weight W (N x K).
    Both operands then have K contiguous."""
    layout = parse_layout("tn")
    assert layout.a_k_major and layout.b_k_major
    nn = parse_layout("nn")
    assert not nn.a_k_major and nn.b_k_major
    tt = parse_layout("tt")
    assert tt.a_k_major and not tt.b_k_major


def test_parse_layout_default_is_tn() -> None:
    assert parse_layout() == Layout(Order.row, Order.col, Order.row)
    assert parse_layout(None).tag == "tn"


def test_explicit_orders_override_the_string() -> None:
    assert parse_layout("tn", layout_a="col") == Layout(Order.col, Order.col)
    assert parse_layout("tn", layout_b="row") == Layout(Order.row, Order.row)
    assert parse_layout("nn", layout_a="row", layout_b="row") == parse_layout("tt")
    assert parse_layout("tn", layout_c="col") == Layout(Order.row, Order.col, Order.col)
    assert parse_layout(layout_a="col", layout_b="row") == parse_layout("nt")
    assert parse_layout("tn", layout_a=Order.col).a is Order.col
    assert parse_layout("tn", layout_a="ROW").a is Order.row


def test_parse_layout_accepts_a_layout() -> None:
    layout = Layout(Order.col, Order.row, Order.col)
    assert parse_layout(layout) == layout
    assert parse_layout(layout, layout_c="row").c is Order.row
    assert parse_layout(layout, layout_a="row") == Layout(Order.row, Order.row, Order.col)


@pytest.mark.parametrize("bad", ["xy", "t", "tnn", "", "row", 12])
def test_parse_layout_bad_string(bad: object) -> None:
    with pytest.raises(ValueError) as err:
        parse_layout(bad)
    assert str(err.value) == (f"layout={bad!r} is not one of 'nn', 'nt', 'tn', 'tt' "
                              "(first letter A, second B; 't' = row-major, 'n' = column-major)")


@pytest.mark.parametrize("what", ["layout_a", "layout_b", "layout_c"])
def test_parse_layout_bad_order(what: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_layout("tn", **{what: "diagonal"})
    assert str(err.value) == f"{what}='diagonal' is not a storage order; use 'row' or 'col'"


def test_parse_order() -> None:
    assert parse_order("row", what="x") is Order.row
    assert parse_order("Col", what="x") is Order.col
    with pytest.raises(ValueError, match="^x='t' is not a storage order; use 'row' or 'col'$"):
        parse_order("t", what="x")


# -- Layout.tag ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", LAYOUTS)
def test_layout_tag(text: str) -> None:
    assert parse_layout(text).tag == text
    assert parse_layout(text, layout_c="col").tag == f"{text}_dcol"
    assert parse_layout(text, layout_c="row").tag == text


def test_layout_is_frozen_and_hashable() -> None:
    layout = parse_layout("tn")
    assert hash(layout) == hash(parse_layout("tn"))
    assert len({parse_layout(t) for t in LAYOUTS}) == 4
    with pytest.raises(AttributeError):
        layout.a = Order.col  # type: ignore[misc]
