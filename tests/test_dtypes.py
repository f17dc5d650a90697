"""The data types beyond 16-bit at the plan stage (no GPU): which type each family and layout takes, the refusals
and their fixes, fp8's scale modes and promotion, and what the rendered kernels say of them."""
from __future__ import annotations

import dataclasses

import pytest

from generator import Gemm
from generator import epilogue as ep
from generator.render import render
from generator.runtime.operands import check_batchable
from generator.spec.grouped import grouped_list_refusal, grouped_refusal
from generator.spec.config import (QUANT_BLOCK, SM90_PROMOTED_MAX_ACCUMULATORS, check_config, has_small_m_kernel,
                                   promote_slices, promoted_accumulators, quantizes_out, second_output)
from generator.spec.types import LAYOUTS, DType, default_out_dtype, parse_input_dtype

FP8 = ("e4m3", "e5m2")


def source(plan: Gemm) -> str:
    return next(iter(render(plan.config).values()))


@pytest.mark.parametrize("spelling, dtype", [
    ("e4m3", DType.e4m3), ("torch.float8_e4m3fn", DType.e4m3), ("float8_e4m3fn", DType.e4m3), ("fp8", DType.e4m3),
    ("e5m2", DType.e5m2), ("torch.float8_e5m2", DType.e5m2), ("float32", DType.tf32), ("torch.float32", DType.tf32),
])
def test_input_spellings(spelling, dtype):
    assert parse_input_dtype(spelling) is dtype


@pytest.mark.parametrize("dtype, out", [(DType.bf16, DType.bf16), (DType.tf32, DType.fp32), (DType.e4m3, DType.bf16),
                                        (DType.e5m2, DType.bf16), (DType.int8, DType.int32)])
def test_default_output(dtype, out):
    assert default_out_dtype(dtype) is out


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_layouts(dtype, layout):
    """wgmma reads 8-bit operands K-major only: tn plans, every other layout is refused with the fix."""
    if layout == "tn":
        plan = Gemm(dtype, layout, arch=90)
        assert plan.config.tile[2] == 128 and plan.out_dtype is DType.bf16
        return
    with pytest.raises(ValueError, match=f"dtype='{dtype}' needs A and B K-major .* plan with layout='tn'"):
        Gemm(dtype, layout, arch=90)


@pytest.mark.parametrize("arch", [80, 86, 89])
def test_fp8_is_sm90_only(arch):
    with pytest.raises(ValueError, match="runs on the sm90 family only .* plan with arch=90"):
        Gemm("e4m3", "tn", arch=arch)


def test_fp8_outputs():
    for out in ("bf16", "fp16", "fp32", "e4m3", "e5m2"):   # (fp8: quantized with its block scales)
        assert Gemm("e4m3", "tn", arch=90, out_dtype=out).out_dtype.value == out
    with pytest.raises(ValueError, match="out_dtype"):
        Gemm("e4m3", "tn", arch=90, out_dtype="int32")


# -- a quantized D (out_dtype e4m3 / e5m2): fp8 values and 1x128 block scales, the op's second output -------------

def test_a_quantized_output_is_an_sm90_row_major_kernel_of_whole_128_column_blocks():
    plan = Gemm("bf16", "tn", arch=90, out_dtype="e4m3", activation="silu", bias="col")
    cfg = plan.config
    assert quantizes_out(cfg) and second_output(cfg) == "scales" and cfg.tile[1] % QUANT_BLOCK == 0
    assert "_oe4m3" in cfg.name and "_oe4m3" in Gemm("e4m3", "tn", arch=90, out_dtype="e4m3").config.name
    assert cfg.epilogue.operands[0].dtype is DType.bf16      # "like the output": the bf16 value before quantizing
    assert not has_small_m_kernel(Gemm("bf16", "tn", arch=90, out_dtype="e4m3", m=8).config)
    text = str(plan)
    assert "returns (D, scales), scales (M, ceil(N/128)) fp32" in text and "s = amax / 448" in text
    assert "copied into an aligned workspace" in text and "batched:      refused" in text
    assert "s = amax / 57344" in str(Gemm("bf16", "tn", arch=90, out_dtype="e5m2"))
    assert "using Out = __nv_fp8_e4m3;" in render(cfg)[cfg.name + ".cu"]


def _with_aux(acc, bias: ep.Col):
    return acc + bias, acc


@pytest.mark.parametrize("knobs, message", [
    (dict(arch=80), "built for the sm90 family only"),
    (dict(arch=90, family="sm80"), "built for the sm90 family only"),
    (dict(arch=90, layout_c="col"), "a quantized D is row-major"),
    (dict(arch=90, tile_shape=(128, 192, 64)), "whole 128-column blocks"),
    (dict(arch=90, tile_shape=(64, 128, 64), schedule="cooperative"), "whole 128-column blocks"),
    (dict(arch=90, epilogue=_with_aux), "cannot have one of its own"),
])
def test_quantized_output_refusals(knobs, message):
    with pytest.raises(ValueError, match=message):
        Gemm("bf16", "tn", out_dtype="e4m3", **knobs).config


def test_a_quantized_output_refuses_batched_and_grouped_calls():
    cfg = Gemm("bf16", "tn", arch=90, out_dtype="e4m3").config
    with pytest.raises(ValueError, match=r"a batched call \(3-D A or B\) cannot store the plan's second output "
                                         r"\(scales\): call the op once per problem"):
        check_batchable(cfg)
    for refusal in (grouped_refusal(cfg), grouped_list_refusal(cfg)):
        assert refusal.startswith("grouped calls do not quantize D (out_dtype='e4m3': its scales are one matrix's): "
                                  "plan out_dtype='bf16'")


def test_a_quantized_output_takes_no_stream_k_and_no_int8_inputs():
    cfg = Gemm("bf16", "tn", arch=90, out_dtype="e4m3").config
    with pytest.raises(ValueError, match="cannot take stream-K"):
        check_config(dataclasses.replace(cfg, stream_k=True))
    with pytest.raises(ValueError, match="not an output of an int8 GEMM"):
        Gemm("int8", "tn", arch=90, out_dtype="e4m3")


def test_emitted_packages_carry_a_quantized_output():
    """A quantized D's op takes the epilogue ops' form in a package: boxed kernels, (D, scales), forward only, no
    grouped overloads; its OpSpec says the block width."""
    from generator.emit import package_files, resolve_ops
    ops = resolve_ops([Gemm("bf16", "tn", arch=90, out_dtype="e4m3"),
                       Gemm("bf16", "tn", arch=90, out_dtype="e5m2", activation="silu", bias="col")])
    files = package_files(ops, "qpkg", autograd=True)
    binding, init = files["csrc/binding.cpp"].decode(), files["qpkg/__init__.py"].decode()
    assert binding.count("/*quant_block=*/128,") == 2 and binding.count("-> (Tensor, Tensor)") == 2
    assert ".grouped(" not in binding and "epilogue_autograd_kernel" in binding
    assert not any(op.differentiable for op in ops)
    assert "returns (D, scales)" in init and "a quantized (e4m3) D has no gradient" in init
    assert ops[1].plan_record()["out_dtype"] == "e5m2"


def test_a_quantized_output_may_return_the_amax_of_d():
    """amax=True: the op also returns the amax of its quantized D (a third output, KernelConfig.amax, a kernel of its
    own name); only a quantized D has one; packages carry it."""
    from generator.emit import package_files, resolve_ops
    from generator.spec.config import output_schema, outputs

    plan = Gemm("bf16", "tn", arch=90, out_dtype="e4m3", amax=True, activation="silu", bias="col")
    cfg = plan.config
    assert cfg.amax and plan.amax and cfg.name.endswith("_oe4m3_amax" + cfg.epilogue.name_suffix)
    assert outputs(cfg) == 3 and output_schema(cfg) == "(Tensor, Tensor, Tensor)"
    assert "returns (D, scales, amax)" in str(plan) and "D_bf16.abs().amax()" in str(plan)
    assert "static constexpr bool kAmax = true;" in render(cfg)[cfg.name + ".cu"]
    assert "static constexpr bool kAmax = false;" in render(Gemm("bf16", "tn", arch=90).config)[
        Gemm("bf16", "tn", arch=90).config.name + ".cu"]
    with pytest.raises(ValueError, match="amax=True records the amax of a quantized D .* plan out_dtype='e4m3'"):
        Gemm("bf16", "tn", arch=90, amax=True)
    with pytest.raises(ValueError, match="amax='yes': give True or False"):
        Gemm("bf16", "tn", arch=90, out_dtype="e4m3", amax="yes")
    ops = resolve_ops([Gemm("bf16", "tn", arch=90, out_dtype="e4m3", amax=True)])
    files = package_files(ops, "apkg", autograd=False)
    binding, init = files["csrc/binding.cpp"].decode(), files["apkg/__init__.py"].decode()
    assert "/*amax=*/true," in binding and "-> (Tensor, Tensor, Tensor)" in binding
    assert "returns (D, scales, amax)" in init and ops[0].name == "gemm_bf16_tn_oe4m3_amax"


def test_promoted_plans_weigh_pingpong_below_cooperative():
    """A promoted pingpong warpgroup promotes with its partner idle (planner/sm90.py PROMOTED_PINGPONG_EFFICIENCY): the
    same tile cooperative, where fast accumulation (nothing to promote) keeps pingpong."""
    shape = dict(m=2048, n=7168, k=2048)
    promoted = Gemm("e4m3", "tn", arch=90, scale="tensor", **shape).config
    fast = Gemm("e4m3", "tn", arch=90, scale="tensor", fast_accum=True, **shape).config
    assert (promoted.tile, promoted.schedule) == ((128, 128, 128), "cooperative")
    assert (fast.tile, fast.schedule) == ((128, 128, 128), "pingpong")


def test_a_promoted_64_row_cooperative_tile_splits_along_n():
    """Each consumer warpgroup promotes its own half of the columns (its B columns, its scale blocks)."""
    for bn in (128, 256):
        cfg = Gemm("e4m3", "tn", arch=90, scale="block", tile_shape=(64, bn, 128), schedule="cooperative").config
        assert cfg.splits_n and cfg.consumer_cols == bn // 2 and promote_slices(cfg) == 1


def test_promotion_limits_the_tile_and_fast_accum_lifts_it():
    promoted = Gemm("e4m3", "tn", arch=90, m=8192, n=8192, k=8192)
    assert promoted.config.promoted and not promoted.fast_accum
    assert promoted.config.tile == (128, 192, 128) and promote_slices(promoted.config) == 1
    assert promoted_accumulators(promoted.config) <= 2 * SM90_PROMOTED_MAX_ACCUMULATORS
    # 4096^3: 128x256 (4 waves of tiles against 128x192's 6), its k tiles summed in two column slices
    sliced = Gemm("e4m3", "tn", arch=90, m=4096, n=4096, k=4096)
    assert sliced.config.tile == (128, 256, 128) and promote_slices(sliced.config) == 2
    assert promoted_accumulators(sliced.config) == 128 + 64
    fast = Gemm("e4m3", "tn", arch=90, m=8192, n=8192, k=8192, fast_accum=True)
    assert fast.config.tile == (128, 256, 128) and "_fa_" in fast.name and not fast.config.promoted
    with pytest.raises(ValueError, match="under fp8's promotion .* or fast_accum=True"):
        Gemm("e4m3", "tn", arch=90, tile_shape=(128, 320, 128), schedule="cooperative")
    with pytest.raises(ValueError, match="fast_accum=True is a knob of fp8 plans"):
        Gemm("bf16", "tn", arch=90, fast_accum=True)
    with pytest.raises(ValueError, match="fast_accum=True: give True or False|give True or False"):
        Gemm("e4m3", "tn", arch=90, fast_accum="yes")


@pytest.mark.parametrize("scale, kinds", [("tensor", ("scalar_tensor", "scalar_tensor")), ("row", ("row", "col")),
                                          ("block", ("row_blocks", "col_blocks"))])
def test_scale_modes_are_the_first_operands(scale, kinds):
    plan = Gemm("e4m3", "tn", arch=90, scale=scale, bias="col")
    ops = plan.config.epilogue.operands
    assert [o.name for o in ops[:2]] == ["scale_a", "scale_b"] and tuple(o.kind for o in ops[:2]) == kinds
    assert plan.scale == scale and f"scale_{scale}" in plan.name
    assert plan.config.epilogue.scale_mode == scale


def test_block_scales_refusals():
    with pytest.raises(ValueError, match="scale='block' is for fp8 inputs"):
        Gemm("bf16", "tn", arch=90, scale="block")
    with pytest.raises(ValueError, match="fast_accum"):
        Gemm("e4m3", "tn", arch=90, scale="block", fast_accum=True)
    with pytest.raises(ValueError, match="scale="):
        Gemm("e4m3", "tn", arch=90, scale="channel")


def test_rendered_fp8_kernels():
    promoted = source(Gemm("e4m3", "tn", arch=90, scale="block"))
    assert "using Elem = __nv_fp8_e4m3;" in promoted and "kPromote = true" in promoted
    assert "kRowBlocksSlot = 0" in promoted and "kColBlocksSlot = 1" in promoted
    fast = source(Gemm("e5m2", "tn", arch=90, fast_accum=True))
    assert "using Elem = __nv_fp8_e5m2;" in fast and "kPromote = false" in fast
    bf16 = source(Gemm("bf16", "tn", arch=90))
    assert "kPromote = false" in bf16 and "kRowBlocksSlot = -1" in bf16


def test_fp8_describes_its_accumulation():
    assert "promoted into fp32" in str(Gemm("e4m3", "tn", arch=90))
    assert "all of K summed inside wgmma" in str(Gemm("e4m3", "tn", arch=90, fast_accum=True))
    assert "wgmma m64nNk32" in str(Gemm("e4m3", "tn", arch=90))


def test_emitted_fp8_ops_are_forward_only(tmp_path):
    from generator.emit import backward_ops, package_files, resolve_ops
    ops = resolve_ops([Gemm("e4m3", "tn", arch=90, scale="row"), Gemm("e4m3", "tn", arch=90, fast_accum=True)])
    assert not any(op.differentiable for op in ops) and backward_ops(ops) == []
    files = package_files(ops, "fp8pkg")
    binding = files["csrc/binding.cpp"].decode()
    for op in ops:
        assert f'm.impl("{op.name}", gemmgen::epilogue_autograd_kernel(&k_{op.name}));' in binding
    assert "c10::ScalarType::Float8_e4m3fn" in binding


@pytest.mark.parametrize("layout", LAYOUTS)
def test_int8_layouts_and_outputs(layout):
    if layout != "tn":
        with pytest.raises(ValueError, match="dtype='int8' needs A and B K-major .* torch._int_mm"):
            Gemm("int8", layout, arch=90)
        return
    plan = Gemm("int8", layout, arch=90)
    assert plan.out_dtype is DType.int32 and plan.config.tile[2] == 128 and not plan.config.promoted
    assert "int32 accumulate" in str(plan)
    for out in ("bf16", "fp16", "fp32"):
        assert Gemm("int8", "tn", arch=90, out_dtype=out, scale="row").out_dtype.value == out


def test_int8_refusals():
    with pytest.raises(ValueError, match="out_dtype='int32' stores int8's exact sums .* out_dtype='bf16'"):
        Gemm("int8", "tn", arch=90, scale="row")
    with pytest.raises(ValueError, match="out_dtype='int32' is the output of int8 GEMMs"):
        Gemm("bf16", "tn", arch=90, out_dtype="int32")
    with pytest.raises(ValueError, match="dtype='int8' needs A and B K-major"):
        Gemm("int8", "tt", arch=80)
    with pytest.raises(ValueError, match="scale='block' is for fp8"):
        Gemm("int8", "tn", arch=90, scale="block", out_dtype="bf16")


@pytest.mark.parametrize("arch", [80, 90])
def test_rendered_int8_kernel(arch):
    plan = Gemm("int8", "tn", arch=arch)
    text = source(plan)
    assert "using Elem = int8_t;" in text and "using Out = int32_t;" in text
    assert ("m16n8k32" if arch == 80 else "m64nNk32") in str(plan)


def test_emitted_int8_op_is_forward_only():
    from generator.emit import package_files, resolve_ops
    ops = resolve_ops([Gemm("int8", "tn", arch=90)])
    binding = package_files(ops, "int8pkg")["csrc/binding.cpp"].decode()
    assert f'm.impl("{ops[0].name}", gemmgen::epilogue_autograd_kernel(&k_{ops[0].name}));' in binding
    assert "c10::ScalarType::Char" in binding and "c10::ScalarType::Int" in binding


@pytest.mark.parametrize("a, b", [("e4m3", "e5m2"), ("e5m2", "e4m3")])
def test_fp8_mixes(a, b):
    plan = Gemm(a, "tn", arch=90, dtype_b=b, scale="row")
    assert plan.dtype.value == a and plan.dtype_b.value == b and f"_{a}x{b}_" in plan.name
    assert f"dtype:        {a} x {b} -> bf16" in str(plan)
    text = source(plan)
    assert f"using Elem = __nv_fp8_{a};" in text and f"using ElemB = __nv_fp8_{b};" in text
    # dtype_b equal to dtype is no mix: the same kernel as without it
    assert Gemm(a, "tn", arch=90, dtype_b=a).name == Gemm(a, "tn", arch=90).name


def test_mixes_are_fp8_only():
    with pytest.raises(ValueError, match="A and B may differ only as fp8's e4m3 and e5m2"):
        Gemm("bf16", "tn", arch=90, dtype_b="fp16")
    with pytest.raises(ValueError, match="A and B may differ only as fp8's e4m3 and e5m2"):
        Gemm("e4m3", "tn", arch=90, dtype_b="int8", out_dtype="bf16")
    with pytest.raises(ValueError, match="dtype_b"):
        Gemm("e4m3", "tn", arch=90, dtype_b="fp64")


def test_emitted_mix_names_b_type():
    from generator.emit import package_files, resolve_ops
    ops = resolve_ops([Gemm("e5m2", "tn", arch=90, dtype_b="e4m3", scale="tensor")])
    binding = package_files(ops, "mixpkg")["csrc/binding.cpp"].decode()
    assert "/*dtype_b=*/c10::ScalarType::Float8_e4m3fn," in binding and '/*dtype_b_name=*/"e4m3",' in binding
    assert ops[0].plan_record()["dtype_b"] == "e4m3"


def test_emitted_tf32_ops_take_every_layout_on_sm90():
    from generator.emit import backward_ops, package_files, resolve_ops
    ops = resolve_ops([Gemm("fp32", "tt", arch=90)])            # B row-major: transposed in shared memory
    assert ops[0].config.family == "sm90" and ops[0].differentiable
    assert all(op.config.family == "sm90" and op.config.dtype is DType.tf32 for op in backward_ops(ops))
    assert "c10::ScalarType::Float" in package_files(ops, "tf32pkg")["csrc/binding.cpp"].decode()


def test_grouped_calls_refuse_tf32_tiles_transposed_in_shared_memory():
    # The sm90 kernel transposes tf32's M/N-major tiles in shared memory; grouped, list and grouped-along-K calls
    # (their own walks) take layout tn only, with the fix; tn keeps them.
    from generator.spec.grouped import grouped_k_refusal
    for layout in ("nn", "nt", "tt"):
        cfg = Gemm("fp32", layout, arch=90).config
        for refusal in (grouped_refusal, grouped_list_refusal, grouped_k_refusal):
            reason = refusal(cfg)
            assert reason is not None and "take layout 'tn' only" in reason and "plan with layout='tn'" in reason
    tn = Gemm("fp32", "tn", arch=90).config
    assert grouped_refusal(tn) is None and grouped_list_refusal(tn) is None


def test_fp8_plans_with_per_row_scales_take_scaled_grouped_calls():
    """scale='row' (torch._scaled_grouped_mm's rowwise form) takes the scaled grouped overloads as scale='block' does,
    on tiles of at most 128 rows; its functor says that a grouped call reads scale_b per group (the kernel offsets the
    column by the group's g * N), the other epilogues' do not; per-tensor scales and fused epilogues take none."""
    from generator.render.epilogue import functor_context
    from generator.spec.grouped import SCALED_GROUPS_MAX_BLOCK_M, reads_cols_per_group, takes_scaled_groups

    row = Gemm("e4m3", "tn", arch=90, scale="row").config
    assert takes_scaled_groups(row) and grouped_refusal(row) is None and reads_cols_per_group(row.epilogue)
    assert functor_context(row.epilogue, True)["epilogue_cols_per_group"] is True
    tall = Gemm("e4m3", "tn", arch=90, scale="row", tile_shape=(256, 128, 128), schedule="cooperative").config
    assert f"tiles of at most {SCALED_GROUPS_MAX_BLOCK_M} rows" in grouped_refusal(tall)
    bias = Gemm("bf16", "tn", arch=90, bias="col").config
    assert not reads_cols_per_group(bias.epilogue)
    assert functor_context(bias.epilogue, True)["epilogue_cols_per_group"] is False
    for cfg in (Gemm("e4m3", "tn", arch=90, scale="tensor").config,
                Gemm("e4m3", "tn", arch=90, scale="row", activation="relu").config):
        assert not takes_scaled_groups(cfg) and "without a fused epilogue" in grouped_refusal(cfg)


def test_a_masked_call_takes_its_scales_in_the_slabs_of_a():
    """GemmOp._masked_scale_rows (gemm_op.h's gemm_masked says the same): per row (E, max_m) and per block
    (E, max_m, ceil(K/128)) scale_a as A's slabs' rows; another shape, or a layout that is not one matrix, refused."""
    import torch

    from generator.runtime.op import GemmOp

    A = torch.empty(3, 4, 256)
    assert GemmOp._masked_scale_rows(torch.ones(3, 4), A, 12, per_row=True).shape == (12,)
    assert GemmOp._masked_scale_rows(torch.ones(3, 4, 2), A, 12, per_row=False).shape == (12, 2)
    with pytest.raises(ValueError, match=r"scale_a has shape \(3, 4, 2\); a masked call's per-row scales of A are "
                                         r"\(E, max_m\), one slab per group as A's"):
        GemmOp._masked_scale_rows(torch.ones(3, 4, 2), A, 12, per_row=True)
    with pytest.raises(ValueError, match=r"per-block scales of A are \(E, max_m, ceil\(K/128\)\)"):
        GemmOp._masked_scale_rows(torch.ones(3, 4), A, 12, per_row=False)
    with pytest.raises(ValueError, match=r"pass scale_a.contiguous\(\)"):
        GemmOp._masked_scale_rows(torch.ones(4, 3).t(), A, 12, per_row=True)
