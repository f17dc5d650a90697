"""emit: the package it writes, its determinism, the names it refuses, and (one build per session) the
wheel that the package builds on a machine without a GPU, installed and imported where gemmgen is not."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from generator import Gemm, emit
from generator import epilogue as ep
from generator.planner.backward import accumulator_config, autograd_form, backward_closure, backward_configs
from generator.emit import GENCODE, backward_ops, resolve_ops
from generator.plans import load_plans_file
from generator.render import included_headers, render, templates_dir
from generator.spec.grouped import grouped_list_refusal, grouped_refusal
from generator.spec.types import Order
from toolchain import find_cuda_home

ROOT = Path(__file__).resolve().parent.parent


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def two_plans() -> list[Gemm]:
    return [Gemm("bf16", "tn", arch=90), Gemm("fp16", "nt", arch=80, out_dtype="fp32", layout_c="col")]


# -- what emit writes -------------------------------------------------------------------------------

def test_emit_writes_a_complete_package(tmp_path):
    plans = two_plans()
    out = emit(plans, name="my_gemms", out=tmp_path / "pkg")
    assert out == tmp_path / "pkg"
    files = tree(out)
    headers = {f"csrc/{h.relative_to(templates_dir()).as_posix()}": h.read_bytes() for h in included_headers()}
    kernels = {f"csrc/{name}": text.encode() for p in plans for name, text in p.render().items()}
    for cfg in backward_closure(p.config for p in plans).values():  # autograd (the default): backward kernels
        kernels.update({f"csrc/{name}": text.encode() for name, text in render(cfg).items()})
    # autograd: the formulas of grouped calls, generator/runtime/grouped_formula.py copied byte for byte
    formula = {"my_gemms/_grouped_formula.py": (ROOT / "generator" / "runtime" / "grouped_formula.py").read_bytes()}
    expected = {".gitignore", "MANIFEST.in", "README.md", "plans.json", "pyproject.toml", "setup.py",
                "csrc/binding.cpp", "my_gemms/__init__.py", *headers, *kernels, *formula}
    assert set(files) == expected
    for rel, data in {**headers, **kernels, **formula}.items():  # kernels as rendered, the rest copied byte for byte
        assert files[rel] == data, rel
    assert "csrc/common/gemm_args.h" in files and "csrc/sm80/gemm_kernel.cuh" in files


def test_the_ops_and_their_names(tmp_path):
    out = emit(two_plans(), name="my_gemms", out=tmp_path / "pkg")
    binding = (out / "csrc" / "binding.cpp").read_text()
    init = (out / "my_gemms" / "__init__.py").read_text()
    ops = ["gemm_bf16_tn", "gemm_fp16_nt_ofp32_dcol"]
    assert "TORCH_LIBRARY(my_gemms, m)" in binding
    assert "TORCH_LIBRARY_IMPL(my_gemms, Meta, m)" in binding
    for op in ops:
        assert f'm.def("{op}(Tensor A, Tensor B) -> Tensor", kTags);' in binding
        assert f'm.def("{op}.out(Tensor A, Tensor B, *, Tensor(a!) out) -> Tensor(a!)", kTags);' in binding
        assert f"def {op}(A, B, *, out=None):" in init
        assert f"_OPS.{op}.default(A, B)" in init
        # the list form: its schema, kernels and Python function; the op called with two lists takes it
        assert f'm.def("{op}.grouped_list(Tensor[] A, Tensor[] B) -> Tensor[]", kTags);' in binding
        assert f'm.impl("{op}.grouped_list", gemmgen::GemmGroupedListKernel{{&k_{op}}});' in binding
        assert f'm.impl("{op}.grouped_list", gemmgen::GemmGroupedListMetaKernel{{&k_{op}}});' in binding
        # differentiable (the package has autograd): __init__.py registers the formula, binding.cpp no refusal
        assert "grouped_list_autograd_kernel" not in binding and f'_register_grouped_autograd("{op}", ' in init
        assert f"{op}.grouped_list = _{op}_grouped_list" in init and f"return _{op}_grouped_list(A, B)" in init
        assert f"_OPS.{op}.grouped_list(list(A), list(B))" in init
        # the masked form: its schema, kernels (a refusal of grad whatever the package's autograd) and function
        assert f'm.def("{op}.masked(Tensor A, Tensor B, Tensor counts) -> Tensor", kTags);' in binding
        for kernel in ("GemmMaskedKernel", "GemmMaskedMetaKernel"):
            assert f'm.impl("{op}.masked", gemmgen::{kernel}{{&k_{op}}});' in binding
        assert f'm.impl("{op}.masked", gemmgen::masked_autograd_kernel("{op}"));' in binding
        assert f"{op}.masked = _{op}_masked" in init and f"return _OPS.{op}.masked(A, B, counts)" in init
    assert "from . import _C" in init and '__all__ = ["gemm_bf16_tn", "gemm_fp16_nt_ofp32_dcol"]' in init
    for plan in two_plans():  # every kernel's C entry points are declared and used
        assert f"int {plan.name}_launch(const GemmArgs* args, void* stream);" in binding
        assert f"/*launch=*/{plan.name}_launch," in binding
    # the docstrings state dtype, out dtype, storage with shapes and strides, kernel and arch
    doc = init.split("def gemm_fp16_nt_ofp32_dcol")[1]
    assert "fp16 (torch.float16) inputs, fp32 (torch.float32) output" in doc
    assert "A:   (M, K) torch.float16, column-major, strides (1, lda)" in doc
    assert "B:   (K, N) torch.float16, row-major, strides (ldb, 1)" in doc
    assert "D:   (M, N) torch.float32, column-major, strides (1, M): torch.empty(N, M).t()" in doc
    assert "Kernel sm80_fp16_nt_dcol_128x256x32_w2x4_s4_g8_ofp32" in doc and "planned for sm_80" in doc
    assert "(tile 128x256x32, warps 2x4, 4 stages)" in doc
    doc = init.split("def gemm_bf16_tn")[1].split("def gemm_fp16_nt_ofp32_dcol")[0]
    assert ("Kernel sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m (tile 128x256x64, cooperative schedule, cluster 2x1, "
            "4 stages), planned for sm_90:") in doc
    assert "built as sm_90a, it runs on GPUs of compute capability 9.0 (H100, H200)" in doc
    # each OpSpec says why its plan takes no grouped call of either form, where it does not (the sm80 op)
    sm80 = two_plans()[1].config
    spec = binding.split("const OpSpec k_gemm_fp16_nt_ofp32_dcol = {")[1].split("};")[0]
    assert f"/*grouped_refusal=*/{json.dumps(grouped_refusal(sm80))}," in spec
    assert f"/*grouped_list_refusal=*/{json.dumps(grouped_list_refusal(sm80))}," in spec
    assert "grouped_refusal" not in binding.split("const OpSpec k_gemm_bf16_tn = {")[1].split("};")[0]
    assert f"This op's plan takes no list call: {grouped_list_refusal(sm80)}." in init


def test_an_op_that_takes_list_calls_but_not_grouped_rows(tmp_path):
    """A column-major A: grouped rows refused (a group starts at any row), list calls taken; the OpSpec carries the
    one refusal (nullptr for the other), the README shows the list call."""
    plan = Gemm("bf16", "nt", arch=90)
    files = tree(emit(plan, name="g", out=tmp_path / "g"))
    binding, readme = files["csrc/binding.cpp"].decode(), files["README.md"].decode()
    assert grouped_list_refusal(plan.config) is None and grouped_refusal(plan.config) is not None
    spec = binding.split("const OpSpec k_gemm_bf16_nt = {")[1].split("};")[0]
    assert f"/*grouped_refusal=*/{json.dumps(grouped_refusal(plan.config))}," in spec
    assert "grouped_list_refusal" not in spec
    assert "D0, D1 = g.gemm_bf16_nt([A0, A1], [B0, B1])" in readme
    assert "# gemm_bf16_nt.grouped(A, B, offsets): refused by this plan" in readme


def test_build_files(tmp_path):
    out = emit(two_plans(), name="my_gemms", out=tmp_path / "pkg")
    setup = (out / "setup.py").read_text()
    pyproject = (out / "pyproject.toml").read_text()
    assert 'requires = ["setuptools>=64", "wheel", "torch", "ninja"]' in pyproject
    assert 'name = "my_gemms"' in pyproject and 'version = "0.1.0"' in pyproject
    assert 'dependencies = ["torch"]' in pyproject
    assert "from torch.utils.cpp_extension import BuildExtension, CUDAExtension" in setup
    assert 'CUDAExtension(\n            name="my_gemms._C"' in setup
    assert "BuildExtension.with_options(use_ninja=True)" in setup
    assert '"-O3",\n    "-std=c++17",' in setup
    assert '"csrc/binding.cpp",' in setup and '"csrc/sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m.cu",' in setup
    assert '"csrc/sm80_fp16_nt_dcol_128x256x32_w2x4_s4_g8_ofp32.cu",' in setup
    gencodes = re.findall(r'"(-gencode=[^"]+)"', setup)
    assert gencodes == ["-gencode=arch=compute_80,code=[sm_80,compute_80]", "-gencode=arch=compute_90a,code=sm_90a"]
    assert "include_dirs=[str(CSRC)]" in setup and 'CSRC = Path(__file__).resolve().parent / "csrc"' in setup
    compile(setup, "setup.py", "exec")
    compile((out / "my_gemms" / "__init__.py").read_text(), "__init__.py", "exec")
    readme = (out / "README.md").read_text()
    assert "pip install --no-build-isolation ." in readme and "import my_gemms" in readme


@pytest.mark.parametrize("arch, gencode", [
    (80, "-gencode=arch=compute_80,code=[sm_80,compute_80]"),
    (86, "-gencode=arch=compute_86,code=[sm_86,compute_86]"),
    (89, "-gencode=arch=compute_89,code=[sm_89,compute_89]"),
    (90, "-gencode=arch=compute_90a,code=sm_90a"),
])
def test_one_gencode_per_distinct_arch(tmp_path, arch, gencode):
    assert GENCODE[arch] == gencode
    out = emit([Gemm("bf16", "tn", arch=arch), Gemm("fp16", "tn", arch=arch)], name="g", out=tmp_path / "g")
    assert re.findall(r'"(-gencode=[^"]+)"', (out / "setup.py").read_text()) == [gencode]


def test_plans_json_keeps_the_size_hints_a_split_k_pick_depends_on(tmp_path):
    """The planner's split-K (stream_k) follows from the problem's size, which no knob pins: plans.json records a
    plan's size hints, so a package's plans re-plan the same kernels (without them this one re-planned no split)."""
    plans = [Gemm("bf16", "tn", arch=90, m=128, n=4096, k=14336), Gemm("bf16", "tt", arch=90, m=256, n=256, k=256,
                                                                        batch=512)]
    assert plans[0].config.stream_k and plans[0].problem.m == 128
    out = emit(plans, name="hinted", out=tmp_path / "pkg", autograd=False)
    record = {p["op_name"]: p for p in json.loads((out / "plans.json").read_text())["plans"]}
    assert (record["gemm_bf16_tn"]["m"], record["gemm_bf16_tn"]["k"]) == (128, 14336)
    assert "batch" not in record["gemm_bf16_tn"] and record["gemm_bf16_tt"]["batch"] == 512
    again, _ = load_plans_file(out / "plans.json")
    assert {p.config for p in again} == {p.config for p in plans}


def test_plans_json_records_pinned_plans_that_replan_the_same_kernels(tmp_path):
    plans = two_plans()
    out = emit(plans, name="my_gemms", out=tmp_path / "pkg", op_names=["mm", None])
    record = json.loads((out / "plans.json").read_text())
    assert record["name"] == "my_gemms" and record["emitted_by"] == "gemmgen"
    assert [p["op_name"] for p in record["plans"]] == ["gemm_fp16_nt_ofp32_dcol", "mm"]  # sorted by op name
    again, names = load_plans_file(out / "plans.json")
    assert {p.config for p in again} == {p.config for p in plans}
    assert names == ["gemm_fp16_nt_ofp32_dcol", "mm"]
    # a record whose knobs no longer plan its kernel fails loudly instead of drifting
    record["plans"][0]["kernel"] = "sm80_something_else"
    (tmp_path / "stale.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="records kernel 'sm80_something_else' but its knobs now plan"):
        load_plans_file(tmp_path / "stale.json")
    by_op = {p["op_name"]: p for p in record["plans"]}
    assert by_op["mm"] == {"op_name": "mm", "kernel": "sm90_bf16_tn_128x256x64_c2x1_s4_coop_g8m", "dtype": "bf16",
                           "out_dtype": "bf16", "layout": "tn", "layout_c": "row", "arch": 90, "family": "sm90",
                           "tile_shape": "128x256x64", "schedule": "cooperative", "cluster_shape": "2x1", "raster": "m",
                           "stages": 4, "raster_group": 8}
    sm80 = by_op["gemm_fp16_nt_ofp32_dcol"]
    assert sm80["family"] == "sm80" and sm80["warps"] == "2x4"
    assert "schedule" not in sm80 and "cluster_shape" not in sm80
    (tmp_path / "bad.json").write_text(json.dumps([{"dtype": "bf16", "arch": 80, "tile": "128x128x32"}]))
    with pytest.raises(ValueError, match="unknown key.*'tile'.*valid keys: dtype"):
        load_plans_file(tmp_path / "bad.json")


def test_plan_emit_names_the_package_after_the_folder(tmp_path):
    out = Gemm("bf16", "tn", arch=80).emit(tmp_path / "my_gemm")
    assert (out / "my_gemm" / "__init__.py").is_file()
    assert "def gemm_bf16_tn(" in (out / "my_gemm" / "__init__.py").read_text()
    out = Gemm("bf16", "tn", arch=80).emit(tmp_path / "x", name="other", op_name="mm")
    assert "def mm(" in (out / "other" / "__init__.py").read_text()
    with pytest.raises(ValueError, match="folder name 'my-gemm' is not a valid package name, so pass name="):
        Gemm("bf16", "tn", arch=80).emit(tmp_path / "my-gemm")


# -- determinism ------------------------------------------------------------------------------------

def test_emitting_twice_gives_identical_bytes(tmp_path):
    first = tree(emit(two_plans(), name="my_gemms", out=tmp_path / "a" / "my_gemms"))
    second = tree(emit(two_plans(), name="my_gemms", out=tmp_path / "b" / "my_gemms"))
    assert first == second
    reordered = tree(emit(two_plans()[::-1], name="my_gemms", out=tmp_path / "c" / "my_gemms"))
    assert reordered == first  # the order of the plans does not matter: everything is sorted


def test_no_absolute_paths_timestamps_or_generator_imports(tmp_path):
    out = emit(two_plans(), name="my_gemms", out=tmp_path / "pkg")
    for rel, data in tree(out).items():
        text = data.decode()
        for path in (str(tmp_path), str(ROOT), str(templates_dir()), os.path.expanduser("~")):
            assert path not in text, f"{rel} contains the path {path}"
        assert not re.search(r"\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d", text), f"{rel} contains a date or time"
        if rel.endswith(".py"):
            # the package must not need gemmgen at install or run time
            assert not re.search(r"^\s*(import|from)\s+(generator|gemmgen\w*)\b", text, re.M), rel
    assert re.search(r"^from torch\.utils\.cpp_extension import", (out / "setup.py").read_text(), re.M)


def test_emitting_again_replaces_the_package(tmp_path):
    out = tmp_path / "pkg"
    emit(two_plans(), name="my_gemms", out=out)
    (out / "build").mkdir()
    (out / "build" / "stale.o").write_text("x")
    emit([Gemm("bf16", "tn", arch=80)], name="other", out=out)
    files = tree(out)
    assert "build/stale.o" not in files and "my_gemms/__init__.py" not in files
    assert "other/__init__.py" in files
    assert not [p for p in tmp_path.iterdir() if p.name != "pkg"], "a staging folder was left behind"


def test_refuses_a_folder_it_did_not_write(tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is a folder that emit did not write"):
        emit(two_plans(), name="my_gemms", out=keep)
    assert tree(keep) == {"notes.txt": b"keep me"}
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        emit(two_plans(), name="my_gemms", out=tmp_path / "file")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (emit(two_plans(), name="my_gemms", out=empty) / "setup.py").is_file()


# -- names ------------------------------------------------------------------------------------------

BAD_NAMES = {
    "my-gemms": "regex", "import": "Python keyword", "Ab": "regex", "a;rm -rf": "regex", "": "regex",
    "1abc": "regex", "caf\u00e9": "regex", "a b": "regex", "x\n": "regex", "../x": "regex", "class": "Python keyword",
}


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_package_names_are_refused(tmp_path, bad):
    with pytest.raises(ValueError, match=BAD_NAMES[bad]) as err:
        emit(two_plans(), name=bad, out=tmp_path / "pkg")
    assert "e.g. name='my_gemms'" in str(err.value)
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("bad", ["torch", "generator", "gemmgen", "aten", "json", "os"])
def test_package_names_that_would_shadow_a_module_are_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="would shadow"):
        emit(two_plans(), name=bad, out=tmp_path / "pkg")


@pytest.mark.parametrize("bad", [*BAD_NAMES, "_private", "name", None, 3])
def test_bad_op_names_are_refused(tmp_path, bad):
    if bad is None:  # None means "the default name": fine for one plan; a non-string is not
        emit([Gemm("bf16", "tn", arch=80)], name="g", out=tmp_path / "ok", op_names=[bad])
        return
    with pytest.raises(ValueError, match="op name"):
        emit([Gemm("bf16", "tn", arch=80)], name="g", out=tmp_path / "pkg", op_names=[bad])
    assert not (tmp_path / "pkg").exists()


def test_duplicate_op_names_are_refused_with_a_suggestion(tmp_path):
    p80, p90 = Gemm("bf16", "tn", arch=80), Gemm("bf16", "tn", arch=90)
    with pytest.raises(ValueError, match=r"both map to the op name 'gemm_bf16_tn'.*"
                                         r"op_names=\['gemm_bf16_tn_sm80', 'gemm_bf16_tn_sm90'\]"):
        emit([p80, p90], name="g", out=tmp_path / "pkg")
    with pytest.raises(ValueError, match="both map to the op name 'mm'"):
        emit([p80, p90], name="g", out=tmp_path / "pkg", op_names=["mm", "mm"])
    with pytest.raises(ValueError, match="one name per plan"):
        emit([p80, p90], name="g", out=tmp_path / "pkg", op_names=["mm"])
    assert not (tmp_path / "pkg").exists()
    out = emit([p80, p90], name="g", out=tmp_path / "pkg", op_names=["mm80", "mm90"])
    assert "def mm80(" in (out / "g" / "__init__.py").read_text()
    # one kernel serving two ops is written once
    ops = resolve_ops([p80, p80], ["a", "b"])
    assert [o.config for o in ops] == [p80.config, p80.config]
    out = emit([p80, p80], name="g", out=tmp_path / "pkg", op_names=["a", "b"], autograd=False)
    assert sum(1 for rel in tree(out) if rel.endswith(".cu")) == 1


def test_emit_needs_plans(tmp_path):
    with pytest.raises(ValueError, match="at least one plan"):
        emit([], name="g", out=tmp_path / "pkg")
    with pytest.raises(TypeError, match="pass Gemm plans"):
        emit(["bf16"], name="g", out=tmp_path / "pkg")


# -- autograd -----------------------------------------------------------------------------------------

_AUTOGRAD_SPEC = re.compile(
    r'const AutogradSpec kgrad_(\w+) = \{\n\s+/\*ns=\*/"(\w+)",\n\s+/\*op=\*/"(\w+)",\n'
    r'\s+/\*dtype=\*/c10::ScalarType::(\w+),\n'
    r'\s+/\*grad_a=\*/\{"(\w+)", "(\w+)"\},\n\s+/\*grad_b=\*/\{"(\w+)", "(\w+)"\},\n'
    r'\s+/\*grad_a_b_row=\*/\{(true|false), (true|false)\},\n\s+/\*grad_b_a_row=\*/\{(true|false), (true|false)\},\n'
    r'\s+/\*grad_a_transposed=\*/\{(true|false), (true|false)\},\n'
    r'\s+/\*grad_b_transposed=\*/\{(true|false), (true|false)\},\n\};')


def autograd_specs(binding: str) -> dict[str, dict]:
    """The AutogradSpec table of an emitted binding.cpp: op -> dtype, and per storage order of dD the ops
    computing dA and dB with the orders they take B.t() and A.t() in (B and A where they compute the transpose),
    and whether each does (planner.backward.autograd_form)."""
    specs = {}
    for m in _AUTOGRAD_SPEC.finditer(binding):
        (var, _ns, op, dtype, ga_row, ga_col, gb_row, gb_col, abr_row, abr_col, bar_row, bar_col,
         at_row, at_col, bt_row, bt_col) = m.groups()
        assert var == op
        specs[op] = {"dtype": {"BFloat16": "bf16", "Half": "fp16"}[dtype],
                     "row": (ga_row, gb_row, *(flag == "true" for flag in (abr_row, bar_row, at_row, bt_row))),
                     "col": (ga_col, gb_col, *(flag == "true" for flag in (abr_col, bar_col, at_col, bt_col)))}
    return specs


def test_backward_ops_are_emitted_for_both_gradient_orders_and_double_backward(tmp_path):
    plans = two_plans()
    out = emit(plans, name="my_gemms", out=tmp_path / "pkg")
    files = tree(out)
    closure = backward_closure(p.config for p in plans)
    # the closure: at most the 8 layouts (A, B, D orders) per dtype, arch and family, each kernel written once; the
    # 16-bit sm90 ones write row-major D only (a column-major gradient is computed as its transpose)
    assert len(closure) == 12 and {(c.dtype.value, c.arch) for c in closure.values()} == {("bf16", 90), ("fp16", 80)}
    assert {c.layout.c for c in closure.values() if c.arch == 90} == {Order.row}
    assert all(c.out_dtype == c.dtype for c in closure.values())
    cu = sorted(rel for rel in files if rel.endswith(".cu"))
    assert cu == sorted({f"csrc/{k}.cu" for k in [*closure, *(p.name for p in plans)]})
    binding = files["csrc/binding.cpp"].decode()
    for kernel in closure:
        op = f"_grad_{kernel}"
        assert f'm.def("{op}(Tensor A, Tensor B) -> Tensor", kTags);' in binding
        assert f'm.def("{op}.out(Tensor A, Tensor B, *, Tensor(a!) out) -> Tensor(a!)", kTags);' in binding
        assert f'm.impl("{op}", GemmMetaKernel{{&k_{op}}});' in binding
        assert f"/*launch=*/{kernel}_launch," in binding
    init = files["my_gemms/__init__.py"].decode()
    assert "AUTOGRAD = True" in init and '__all__ = ["gemm_bf16_tn", "gemm_fp16_nt_ofp32_dcol"]' in init
    table = autograd_specs(binding)
    # every op is differentiable, the backward ops too (double backward), with gemmgen's layouts
    assert set(table) == {"gemm_bf16_tn", "gemm_fp16_nt_ofp32_dcol", *(f"_grad_{k}" for k in closure)}
    configs = {"gemm_bf16_tn": plans[0].config, "gemm_fp16_nt_ofp32_dcol": plans[1].config,
               **{f"_grad_{k}": c for k, c in closure.items()}}
    for op, spec in table.items():
        assert spec["dtype"] == configs[op].dtype.value
        for order in Order:
            grad_a, grad_b = backward_configs(configs[op], order)
            form = autograd_form(configs[op], grad_a, grad_b)
            assert spec[order.value] == (f"_grad_{grad_a.name}", f"_grad_{grad_b.name}", form.a_b_row, form.b_a_row,
                                         form.a_transposed, form.b_transposed), (op, order)
        assert f'm.impl("{op}", GemmAutogradKernel{{&kgrad_{op}}});' in binding
        assert f'm.impl("{op}.out", GemmOutAutogradKernel{{&kgrad_{op}}});' in binding
    record = json.loads(files["plans.json"])
    assert record["autograd"] is True and record["backward_kernels"] == sorted(closure)
    readme = files["README.md"].decode()
    assert "## Autograd" in readme and "double backward works" in readme
    assert all(f"- `{k}`" in readme for k in closure)


def test_a_kernel_shared_by_an_op_and_the_backward_is_written_once(tmp_path):
    plan = Gemm("bf16", "tt", arch=80)   # tt is also the dA kernel of tn, and in its own closure
    ops = resolve_ops([plan])
    grads = backward_ops(ops)
    assert plan.name in {op.config.name for op in grads} and len(grads) == 8
    files = tree(emit([plan], name="g", out=tmp_path / "g"))
    assert sum(1 for rel in files if rel.endswith(".cu")) == 8
    # the public op and its private twin share the kernel, not the op
    binding = files["csrc/binding.cpp"].decode()
    assert binding.count(f"/*launch=*/{plan.name}_launch,") == 2


def test_no_autograd_leaves_the_backward_out(tmp_path):
    plans = two_plans()
    out = emit(plans, name="my_gemms", out=tmp_path / "api", autograd=False)
    files = tree(out)
    assert sorted(rel for rel in files if rel.endswith(".cu")) == sorted(f"csrc/{p.name}.cu" for p in plans)
    assert not [rel for rel, data in files.items() if b"_grad_" in data], "backward ops in a --no-autograd package"
    init = files["my_gemms/__init__.py"].decode()
    binding = files["csrc/binding.cpp"].decode()
    assert "AUTOGRAD = False" in init and "AutogradSpec" not in binding
    # its one Autograd block refuses grad for the grouped overloads (as an epilogue op's refuses it: no formula)
    autograd_block = binding.split("TORCH_LIBRARY_IMPL(my_gemms, Autograd, m) {\n")[1].split("}")[0]
    assert autograd_block == "".join(f'  m.impl("{op}.grouped", gemmgen::grouped_autograd_kernel("{op}"));\n'
                                     f'  m.impl("{op}.grouped_list", gemmgen::grouped_list_autograd_kernel("{op}"));\n'
                                     f'  m.impl("{op}.masked", gemmgen::masked_autograd_kernel("{op}"));\n'
                                     for op in ("gemm_bf16_tn", "gemm_fp16_nt_ofp32_dcol")), autograd_block
    compile(init, "__init__.py", "exec")
    record = json.loads(files["plans.json"])
    assert record["autograd"] is False and record["backward_kernels"] == []
    assert "emitted without autograd" in files["README.md"].decode()
    assert "--no-autograd --out <folder>" in files["README.md"].decode()
    # the command line's --no-autograd writes the same package
    args = [a for p in ("dtype=bf16,layout=tn,arch=90", "dtype=fp16,layout=nt,arch=80,out_dtype=fp32,layout_c=col")
            for a in ("--plan", p)]
    r = subprocess.run([sys.executable, "-m", "generator", "emit", *args, "--name", "my_gemms", "--no-autograd",
                        "--out", str(tmp_path / "cli")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "autograd: none (--no-autograd)" in r.stdout
    assert tree(tmp_path / "cli") == files
    assert tree(emit(plans, name="my_gemms", out=tmp_path / "again", autograd=False)) == files  # deterministic
    with pytest.raises(TypeError, match="autograd='no' must be True or False"):
        emit(plans, name="my_gemms", out=tmp_path / "bad", autograd="no")


_GROUPED_REGISTRATION = re.compile(r'_register_grouped_autograd\("(\w+)", "(\w+)", \{\n'
                                   r'    "row": \("(\w+)", "(\w+)", (True|False), (True|False)\),\n'
                                   r'    "col": \("(\w+)", "(\w+)", (True|False), (True|False)\),\n\}\)')


def test_grouped_calls_take_the_jit_formulas_with_autograd(tmp_path):
    """With autograd, the .grouped and .grouped_list of every differentiable op (the backward ops' too: double
    backward) take the JIT ops' formulas: binding.cpp registers no Autograd kernel for them, the package ships
    generator/runtime/grouped_formula.py as _grouped_formula.py, and __init__.py registers its formulas with the
    backward ops of both gradient orders, recording which of those take grouped and list calls (their plans'
    refusals, decided at emit time). An fp8 op keeps binding.cpp's refusal of grad."""
    plans = [*two_plans(), Gemm("e4m3", "tn", arch=90)]
    files = tree(emit(plans, name="my_gemms", out=tmp_path / "pkg"))
    binding, init = files["csrc/binding.cpp"].decode(), files["my_gemms/__init__.py"].decode()
    assert files["my_gemms/_grouped_formula.py"] == (ROOT / "generator" / "runtime" / "grouped_formula.py").read_bytes()
    assert "from . import _grouped_formula as _gf" in init
    ops = resolve_ops(plans)
    differentiable = [op for op in [*ops, *backward_ops(ops)] if op.differentiable]
    registered = {m[0]: m[1:] for m in _GROUPED_REGISTRATION.findall(init)}
    assert set(registered) == {op.name for op in differentiable}
    autograd = impl_block(binding, "my_gemms", "Autograd")
    for op in differentiable:
        want = [op.config.dtype.torch_name]
        for order in (Order.row, Order.col):
            grad_a, grad_b = backward_configs(op.config, order)
            form = autograd_form(op.config, grad_a, grad_b)
            want += [f"_grad_{grad_a.name}", f"_grad_{grad_b.name}", str(form.a_transposed), str(form.b_transposed)]
        assert registered[op.name] == tuple(want), op.name
        assert f'"{op.name}.grouped' not in autograd, op.name
        # .masked has no formula: binding.cpp's refusal, with autograd too
        assert f'  m.impl("{op.name}.masked", gemmgen::masked_autograd_kernel("{op.name}"));' in autograd, op.name
    (quantized,) = [op.name for op in ops if not op.differentiable]
    assert (f'  m.impl("{quantized}.grouped", gemmgen::grouped_autograd_kernel("{quantized}"));\n'
            f'  m.impl("{quantized}.grouped_list", gemmgen::grouped_list_autograd_kernel("{quantized}"));') in autograd
    # each backward op the formulas call: its orders, D's dtype, and whether its plan takes grouped and list calls
    called = {name for names in registered.values() for name in (names[1], names[2], names[5], names[6])}
    for cfg in backward_closure(p.config for p in plans[:2]).values():
        assert f"_grad_{cfg.name}" in called
        layout = cfg.layout
        facts = (f"{layout.a is Order.row}, {layout.b is Order.row}, {layout.c is Order.row}, "
                 f'"{cfg.out_dtype.torch_name}", {grouped_refusal(cfg) is None}, {grouped_list_refusal(cfg) is None}')
        assert f'"_grad_{cfg.name}", {facts}),' in init, cfg.name
    compile(init, "__init__.py", "exec")
    assert "my_gemms/_grouped_formula.py" in files["README.md"].decode()
    # without autograd: no formula module, every grouped overload refuses grad
    # (test_no_autograd_leaves_the_backward_out)
    bare = tree(emit(plans, name="my_gemms", out=tmp_path / "bare", autograd=False))
    assert "my_gemms/_grouped_formula.py" not in bare and b"_grouped_formula" not in bare["my_gemms/__init__.py"]


#: Run with the package's _grouped_formula.py importable and gemmgen not: it imports (torch and the standard library
#: only), and its formulas give float64's gradients on CPU stand-in ops, through both paths (grouped and list calls;
#: plain calls where a plan refuses them).
FORMULA_ALONE = '''
import sys

import torch
import _grouped_formula as gf

assert "generator" not in sys.modules
calls = []


def grad_op(a_row, b_row, takes):
    def matmul(form):
        def run(x, y, *rest):
            calls.append(form)
            if form == "list":
                return [(u.float() @ v.float()).bfloat16() for u, v in zip(x, y)]
            if form == "grouped":
                ends = [0, *rest[0].tolist()]
                pairs = enumerate(zip(ends, ends[1:]))
                if y.dim() == 2:   # groups along K
                    return torch.stack([x[:, s:e].float() @ y[s:e].float() for _, (s, e) in pairs]).bfloat16()
                return torch.cat([x[s:e].float() @ y[g].float() for g, (s, e) in pairs]).bfloat16()
            return (x.float() @ y.float()).bfloat16()
        return run

    plan = None if takes else "this plan takes no grouped call"
    return gf.GradOp(call=matmul("plain"), grouped=matmul("grouped"), grouped_list=matmul("list"), a_row=a_row,
                     b_row=b_row, d_row=True, out_dtype=torch.bfloat16,
                     grouped_call_refusal=lambda x, y: gf.grouped_call_refusal(plan, a_row, b_row, x, y),
                     list_problem_refusal=lambda i, x, y: gf.list_problem_refusal(plan, a_row, b_row, i, x, y))


torch.manual_seed(0)
a, b = torch.randn(40, 32).bfloat16(), torch.randn(4, 24, 32).bfloat16().transpose(1, 2)   # tn: B (E, K, N)
offsets, g = torch.tensor([5, 5, 22, 40], dtype=torch.int32), torch.randn(40, 24).bfloat16()
ends = [0, 5, 5, 22, 40]
ref_a = torch.cat([g[s:e].double() @ b[i].double().t() for i, (s, e) in enumerate(zip(ends, ends[1:]))])
ref_b = torch.stack([a[s:e].double().t() @ g[s:e].double() for s, e in zip(ends, ends[1:])])
for takes, paths in ((True, ["grouped", "grouped"]), (False, ["plain"] * 6)):
    formula = gf.Formula("op", torch.bfloat16, lambda row: (grad_op(True, True, takes), grad_op(False, True, takes)))
    calls.clear()
    da, db = gf.grouped_backward(formula, a, b, offsets, g, True, True)
    assert calls == paths, calls
    assert ((da.double() - ref_a).norm() / ref_a.norm()).item() < 1e-2
    assert ((db.double() - ref_b).norm() / ref_b.norm()).item() < 1e-2 and not db[1].any()
    calls.clear()
    da, db = gf.list_backward(formula, [a[:5], a[5:22]], [b[0], b[2]], [g[:5], None], [True, True], [True, True])
    assert da[1] is None and db[1] is None and calls == (["list"] * 2 if takes else ["plain"] * 2), calls
    assert ((da[0].double() - ref_a[:5]).norm() / ref_a[:5].norm()).item() < 1e-2
    assert ((db[0].double() - ref_b[0]).norm() / ref_b[0].norm()).item() < 1e-2
print("FORMULA OK")
'''


def test_the_formula_module_runs_without_gemmgen(tmp_path):
    """The package's _grouped_formula.py imports only torch and the standard library (read from its source), and
    imports and runs where gemmgen cannot be imported (a fake `generator` refuses, the repository is off sys.path)."""
    import ast

    pytest.importorskip("torch")
    pkg = emit([Gemm("bf16", "tn", arch=90)], name="my_gemms", out=tmp_path / "pkg")
    source = (pkg / "my_gemms" / "_grouped_formula.py").read_text()
    imported = {(node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
                for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names}
    assert imported <= {"__future__", "dataclasses", "typing", "torch"}, imported
    fake = tmp_path / "no_generator" / "generator"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("generator is hidden for this test")\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pkg / "my_gemms"), str(fake.parent)]))
    r = subprocess.run([sys.executable, "-c", FORMULA_ALONE], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FORMULA OK" in r.stdout


#: Kernel entry points for a binding built without its kernels: every launch fails, so a CUDA call would say so;
#: the CPU kernels below stand in for them.
STUB_KERNELS = """#include "common/gemm_args.h"
extern "C" {{
{stubs}
}}
"""
STUB_KERNEL = ('int {k}_launch(const GemmArgs*, void*) {{ return 1; }}\n'
               'const char* {k}_error_string(int) {{ return "a stub kernel (test_emit)"; }}')

#: After `import <package> as pkg` (the real binding, stub kernels): CPU kernels with torch.matmul in place of the
#: kernels, and the kernels' dtype and storage-order checks, so a backward op called with an operand in the
#: wrong order (or dtype) fails as it would on the GPU. An op with a fused epilogue applies it with the package's
#: own function of it (pkg._epilogue_<op>, which tests/test_render_epilogue_python.py checks against
#: generator.runtime.evaluate). The CPU key takes CPU tensors before the binding's CompositeExplicitAutograd
#: kernel; the Autograd kernels stay the binding's (and __init__.py's).
CPU_KERNELS = '''
SPECS = {specs!r}  # op -> (dtype, out dtype, A order, B order, D order)
DTYPES = {{"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}}
_LIB = torch.library.Library({name!r}, "IMPL")


def _stored(t, order):
    rows, cols = t.shape
    if order == "row":
        return (cols <= 1 or t.stride(1) == 1) and (rows <= 1 or t.stride(0) >= max(cols, 1))
    return (rows <= 1 or t.stride(0) == 1) and (cols <= 1 or t.stride(1) >= max(rows, 1))


def _run(op, A, B, *values):
    dtype, out_dtype, a_order, b_order, d_order = SPECS[op]
    for t, order, what in ((A, a_order, "A"), (B, b_order, "B")):
        if t.dtype != DTYPES[dtype]:
            raise TypeError(f"{{op}}: {{what}} is {{t.dtype}}, the op takes {{dtype}}")
        if not _stored(t, order):
            raise ValueError(f"{{op}}: {{what}} has strides {{t.stride()}}, the op takes {{order}}-major")
    acc = A.float() @ B.float()   # fp32 accumulation, the epilogue in fp32, one rounding: as the kernels
    epilogue = getattr(pkg, "_epilogue_" + op, None)
    outs = [t.to(DTYPES[out_dtype]) for t in (epilogue(acc, *values) if epilogue else (acc,)) if t is not None]
    outs = [t.contiguous() if d_order == "row" else t.t().contiguous().t() for t in outs]
    return outs[0] if len(outs) == 1 else tuple(outs)


for _op in SPECS:
    _LIB.impl(_op, (lambda op: lambda *args: _run(op, *args))(_op), "CPU")
    _LIB.impl(f"{{_op}}.out", (lambda op: lambda *args, out: out.copy_(_run(op, *args)))(_op), "CPU")
'''

AUTOGRAD_CHECK = '''
import itertools
import sys

import torch
import {name} as pkg

assert "generator" not in sys.modules and pkg.AUTOGRAD is True
{cpu_kernels}
dump = torch._C._dispatch_dump
for op in SPECS:  # every op, the private backward ops included, has the binding's formula; .out refuses grad
    for overload in (op, op + ".out"):
        assert "Autograd[alias]: registered at" in dump("{name}::" + overload), dump("{name}::" + overload)
        assert "binding.cpp" in dump("{name}::" + overload).split("Autograd[alias]: registered at")[1].split("\\n")[0]
BOUND = {{torch.bfloat16: 1e-2, torch.float16: 5e-3}}


def operand(rows, cols, order, dtype):
    t = torch.randn(rows, cols) if order == "row" else torch.randn(cols, rows).t()
    return t.to(dtype).requires_grad_()


def rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def stored(t, order):
    return t.stride(1 if order == "row" else 0) == 1 or min(t.shape) <= 1


def upstream(kind, m, n, dtype):
    if kind == "row":
        return torch.randn(m, n).to(dtype)
    if kind == "col":
        return torch.randn(n, m).to(dtype).t()
    return torch.randn(m, n + 3).to(dtype)[:, 1:n + 1]  # sliced: a leading dimension of its own


torch.manual_seed(0)
for op, plan in pkg.PLANS.items():
    fn, dtype = getattr(pkg, op), DTYPES[plan["dtype"]]
    for (m, n, k), kind in itertools.product(((64, 48, 32), (33, 17, 65), (1, 5, 7), (30, 1, 40)),
                                             ("row", "col", "sliced", "expanded")):
        a, b = operand(m, k, plan["layout_a"], dtype), operand(k, n, plan["layout_b"], dtype)
        a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
        d = fn(a, b)
        if kind == "expanded":  # dD of strides (0, 0)
            d.sum().backward()
            (a64 @ b64).sum().backward()
        else:
            g = upstream(kind, m, n, d.dtype)
            d.backward(g)
            (a64 @ b64).backward(g.double())
        for got, ref, t, order in ((a.grad, a64.grad, a, plan["layout_a"]), (b.grad, b64.grad, b, plan["layout_b"])):
            assert got.dtype == dtype and got.shape == t.shape and stored(got, order), (op, got.stride())
            assert rel(got, ref) <= BOUND[dtype], (op, m, n, k, kind, rel(got, ref))

    # double backward: the gradients' own gradients, by the backward ops' formula
    a, b = operand(40, 24, plan["layout_a"], dtype), operand(24, 56, plan["layout_b"], dtype)
    d = fn(a, b)
    g = torch.randn(40, 56).to(d.dtype).requires_grad_()
    ga, gb = torch.autograd.grad(d, (a, b), g, create_graph=True)
    w1, w2 = torch.randn(40, 24).to(dtype).float(), torch.randn(24, 56).to(dtype).float()
    ((ga.float() * w1).sum() + (gb.float() * w2).sum()).backward()
    a64, b64, g64 = (t.detach().double().requires_grad_() for t in (a, b, g))
    ga64, gb64 = torch.autograd.grad(a64 @ b64, (a64, b64), g64, create_graph=True)
    ((ga64 * w1.double()).sum() + (gb64 * w2.double()).sum()).backward()
    for got, ref, what in ((a.grad, a64.grad, "A"), (b.grad, b64.grad, "B"), (g.grad, g64.grad, "dD")):
        assert rel(got, ref) <= BOUND[dtype], (op, "double backward", what, rel(got, ref))

    # out= is not differentiable (as torch's out= ops), and says so at the call
    out = d.detach().clone()
    try:
        fn(a, b, out=out)
    except RuntimeError as err:
        assert "out=... arguments don't support automatic differentiation" in str(err), str(err)
    else:
        raise SystemExit(op + ".out accepted inputs that require grad")
    with torch.no_grad():
        assert fn(a, b, out=out) is out
        assert fn(a, b).grad_fn is None
{grouped}
print("AUTOGRAD OK")
'''

#: AUTOGRAD_CHECK's grouped calls: CPU stand-ins of .grouped and .grouped_list (refusing what the kernel library
#: refuses: a plan that takes no such call, operands off the 16-byte rule), recording each launch; then the gradients
#: of __init__.py's grouped formulas (gemmgen's grouped_formula, shipped as _grouped_formula.py) against float64, the
#: calls they make, double backward, and the refusal of a traced backward.
GROUPED_GRADS = '''
TAKES = {takes!r}   # op -> (whether its plan takes grouped calls, and list calls)
GRADS = {grads!r}   # op -> (dA op, dB op) of a row-major gradient
CALLS = []          # (op, form) of every launch
_run_plain = _run


def _run(op, *args):   # (the plain CPU kernels above look _run up when they run)
    CALLS.append((op, "plain"))
    return _run_plain(op, *args)


def _check(op, t, order, what, work):
    dtype = DTYPES[SPECS[op][0]]
    rows, cols = t.shape[-2:]
    (outer, inner) = t.stride()[-2:] if order == "row" else t.stride()[-1:-3:-1]
    if t.dtype != dtype or not ((cols if order == "row" else rows) <= 1 or inner == 1):
        raise ValueError(f"{{op}}: {{what}} is {{t.dtype}} with strides {{t.stride()}}, the op takes {{order}}-major")
    ld = outer if (rows if order == "row" else cols) > 1 else max(cols if order == "row" else rows, 1)
    stride = t.stride(0) if t.dim() == 3 and t.shape[0] > 1 else 0
    if work and (t.data_ptr() % 16 or ld * t.element_size() % 16 or stride * t.element_size() % 16):
        raise ValueError(f"{{op}}: {{what}} breaks the 16-byte rule of grouped calls")


def _out(op, acc):
    d = acc.to(DTYPES[SPECS[op][1]])
    return d.contiguous() if SPECS[op][4] == "row" else d.t().contiguous().t()


def _grouped(op, A, B, offsets):
    if B.dim() == 2:   # groups along K: the list kernel's plans, K the outer dimension of A and B
        return _grouped_k(op, A, B, offsets)
    CALLS.append((op, "grouped"))
    if not TAKES[op][0]:
        raise ValueError(op + ": its plan takes no grouped call")
    work = A.shape[0] > 0 and A.shape[1] > 0 and B.shape[2] > 0
    _check(op, A, SPECS[op][2], "A", work)
    _check(op, B, SPECS[op][3], "B", work)
    ends = [0, *offsets.tolist()]
    acc = torch.zeros(A.shape[0], B.shape[2])
    for g, (start, end) in enumerate(zip(ends, ends[1:])):
        acc[start:end] = A[start:end].float() @ B[g].float()
    return _out(op, acc)


def _grouped_k(op, A, B, offsets):
    CALLS.append((op, "grouped_k"))
    if not TAKES[op][1] or SPECS[op][2] != "col" or SPECS[op][3] != "row":
        raise ValueError(op + ": its plan takes no grouped call along K")
    work = A.shape[0] > 0 and A.shape[1] > 0 and B.shape[1] > 0
    _check(op, A, SPECS[op][2], "A", work)
    _check(op, B, SPECS[op][3], "B", work)
    ends = [0, *offsets.tolist()]
    return torch.stack([_out(op, A[:, start:end].float() @ B[start:end].float())
                        for start, end in zip(ends, ends[1:])])


def _listed(op, As, Bs):
    CALLS.append((op, "list", len(As)))
    if not TAKES[op][1]:
        raise ValueError(op + ": its plan takes no list call")
    for i, (x, y) in enumerate(zip(As, Bs)):
        work = x.shape[0] > 0 and x.shape[1] > 0 and y.shape[1] > 0
        _check(op, x, SPECS[op][2], f"A[{{i}}]", work)
        _check(op, y, SPECS[op][3], f"B[{{i}}]", work)
    return [_out(op, x.float() @ y.float()) for x, y in zip(As, Bs)]


for _op in TAKES:
    _LIB.impl(f"{{_op}}.grouped", (lambda op: lambda *args: _grouped(op, *args))(_op), "CPU")
    _LIB.impl(f"{{_op}}.grouped_list", (lambda op: lambda *args: _listed(op, *args))(_op), "CPU")
    for overload in ("grouped", "grouped_list"):   # every op's formula: __init__.py's, by torch.library
        line = dump("{name}::" + _op + "." + overload).split("Autograd[alias]: registered at ")[1].split("\\n")[0]
        assert "torch/library.py" in line, (_op, overload, line)


def grouped_operands(plan, sizes, n, k, dtype):
    a = operand(sum(sizes), k, plan["layout_a"], dtype)
    b = (torch.randn(len(sizes), k, n) if plan["layout_b"] == "row" else torch.randn(len(sizes), n, k).transpose(1, 2))
    offsets = torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)
    return a, b.to(dtype).requires_grad_(), offsets


def grouped_reference(a, b, offsets, g):
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    ends = [0, *offsets.tolist()]
    d64 = torch.cat([a64[s:e] @ b64[i] for i, (s, e) in enumerate(zip(ends, ends[1:]))])
    d64.backward(g.double())
    return a64.grad, b64.grad


def check_grad(op, got, ref, t, order, what):
    assert got.dtype == t.dtype and got.shape == t.shape, (op, what, got.dtype, got.shape)
    assert (got.stride(-1) == 1) == (order == "row"), (op, what, got.stride())
    assert rel(got, ref) <= BOUND[t.dtype], (op, what, rel(got, ref))


CHECKED = []   # (op, form) of the checks made
SIZES = [5, 0, 17, 18]
LIST_SIZES = [(5, 32, 24), (17, 8, 40), (0, 16, 8), (33, 40, 16)]   # (M, K, N): leading dimensions on the rule
for op, plan in pkg.PLANS.items():
    fn, dtype = getattr(pkg, op), DTYPES[plan["dtype"]]
    grad_a_op, grad_b_op = GRADS[op]
    if TAKES[op][0]:   # the offsets form, where the forward takes it (an sm90 plan, A row-major)
        for kind in ("row", "col", "sliced", "expanded"):
            a, b, offsets = grouped_operands(plan, SIZES, 24, 32, dtype)
            d = fn.grouped(a, b, offsets)
            g = upstream(kind, *d.shape, d.dtype) if kind != "expanded" else torch.ones(()).to(d.dtype).expand(d.shape)
            CALLS.clear()
            d.backward(g)
            # an unaligned gradient: one plain call per group with rows; else the grouped dA and the dB call along K
            want = ([(grad_a_op, "plain")] * 3 + [(grad_b_op, "plain")] * 3 if kind == "sliced" else
                    [(grad_a_op, "grouped"), (grad_b_op, "grouped_k")])
            assert CALLS == want, (op, kind, CALLS)
            ref_a, ref_b = grouped_reference(a, b, offsets, g)
            check_grad(op, a.grad, ref_a, a, plan["layout_a"], "dA")
            check_grad(op, b.grad, ref_b, b, plan["layout_b"], "dB")
            assert not b.grad[1].any() and offsets.grad is None
        # double backward: the dA op's grouped call has the formula too
        a, b, offsets = grouped_operands(plan, SIZES, 16, 24, dtype)
        (ga,) = torch.autograd.grad(fn.grouped(a, b, offsets).float().pow(2).sum(), a, create_graph=True)
        ga.float().sum().backward()
        a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
        ends = [0, *offsets.tolist()]
        d64 = torch.cat([a64[s:e] @ b64[i] for i, (s, e) in enumerate(zip(ends, ends[1:]))])
        (g64,) = torch.autograd.grad(d64.pow(2).sum(), a64, create_graph=True)
        g64.sum().backward()
        assert rel(b.grad, b64.grad) <= 2e-2 and rel(a.grad, a64.grad) <= 2e-2, (op, "grouped double backward")
        # a traced backward (meta tensors here) cannot read the group ends: refused with the workaround
        m = dict(device="meta")
        d = fn.grouped(a.detach().to(**m).requires_grad_(), b.detach().to(**m), offsets.to(**m))
        try:
            d.sum().backward()
        except RuntimeError as err:
            assert f"{{op}}.grouped: the backward of a grouped call reads the group sizes" in str(err), str(err)
        else:
            raise SystemExit(op + ": a traced grouped backward was not refused")
        CHECKED.append((op, "grouped"))
    if TAKES[op][1]:   # the list form: one list call on the dA op and one on the dB op
        a = [operand(m_, k_, plan["layout_a"], dtype) for m_, k_, _ in LIST_SIZES]
        b = [operand(k_, n_, plan["layout_b"], dtype) for _, k_, n_ in LIST_SIZES]
        d = fn(a, b)
        grads = [torch.randn(t.shape).to(t.dtype) for t in d]
        CALLS.clear()
        torch.autograd.backward(d, grads)
        assert CALLS == [(grad_a_op, "list", 3), (grad_b_op, "list", 3)], (op, CALLS)
        for x, y, gd in zip(a, b, grads):
            x64, y64 = (t.detach().double().requires_grad_() for t in (x, y))
            (x64 @ y64).backward(gd.double())
            if x.numel():
                check_grad(op, x.grad, x64.grad, x, plan["layout_a"], "dA_i")
            check_grad(op, y.grad, y64.grad, y, plan["layout_b"], "dB_i")
        CHECKED.append((op, "list"))
print("GROUPED OK", sorted(CHECKED))
'''


def binding_with_stub_kernels(pkg: Path, name: str, kernels: list[str], tmp_path: Path) -> dict[str, str]:
    """Build an emitted package's binding.cpp here against stub kernels (STUB_KERNEL each) into an importable folder
    beside a ``generator`` that refuses to import (the package must not need gemmgen); returns the environment
    that imports it. Skips without nvcc or Python's headers."""
    from generator.toolchain import BuildError, nvcc_path
    from generator.runtime.jit_runtime import torch_flags

    try:
        nvcc = nvcc_path()
    except BuildError as err:
        pytest.skip(f"no nvcc to build the binding: {err}")
    import sysconfig

    python_include = Path(sysconfig.get_paths()["include"])
    if not (python_include / "Python.h").is_file():
        pytest.skip(f"no Python.h under {python_include} (the binding includes it): install Python's headers")
    site = tmp_path / "site" / name
    site.mkdir(parents=True)
    for module in (pkg / name).glob("*.py"):   # __init__.py, and with autograd _grouped_formula.py
        shutil.copy(module, site / module.name)
    stubs = "\n".join(STUB_KERNEL.format(k=k) for k in kernels)
    (pkg / "csrc" / "stubs.cpp").write_text(STUB_KERNELS.format(stubs=stubs))
    build = subprocess.run([nvcc, "-std=c++20", "-shared", "-Xcompiler", "-fPIC", f"-I{pkg / 'csrc'}",
                            f"-I{python_include}", *torch_flags(), str(pkg / "csrc" / "binding.cpp"),
                            str(pkg / "csrc" / "stubs.cpp"), "-o", str(site / "_C.so")],
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    fake = tmp_path / "no_generator" / "generator"   # the package must not need gemmgen
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("generator is hidden for this test")\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site.parent), str(fake.parent)]))
    return env


AUTOGRAD_CPU, EPILOGUE_CPU = "gemmgen_autograd_cpu", "gemmgen_epilogue_cpu"


def autograd_cpu_plans() -> list[Gemm]:
    return [*two_plans(), Gemm("bf16", "nn", arch=80), Gemm("fp16", "tt", arch=90)]


@pytest.fixture(scope="module")
def stub_bindings(tmp_path_factory) -> dict[str, Future]:
    """The packages of test_autograd_formula_of_the_binding_on_cpu (AUTOGRAD_CPU) and test_epilogue_binding_on_cpu
    (EPILOGUE_CPU), emitted and built with stub kernels (binding_with_stub_kernels) at once, one build per core:
    each is a host compile of its binding.cpp against torch's headers (15-20 s on one core, most of either test).
    {package name: a done future of the environment that imports it}; each test takes its own result, so a failed
    build fails (and a missing nvcc skips) that test alone."""
    pytest.importorskip("torch")
    plans = {AUTOGRAD_CPU: autograd_cpu_plans(), EPILOGUE_CPU: epilogue_cpu_plans()}
    packages = {name: emit(p, name=name, out=tmp_path_factory.mktemp(name) / "pkg") for name, p in plans.items()}
    ops = resolve_ops(plans[AUTOGRAD_CPU])
    kernels = {AUTOGRAD_CPU: sorted({op.config.name for op in [*ops, *backward_ops(ops)]}),
               EPILOGUE_CPU: sorted(p.stem for p in (packages[EPILOGUE_CPU] / "csrc").glob("*.cu"))}

    def build(name: str) -> dict[str, str]:
        return binding_with_stub_kernels(packages[name], name, kernels[name], packages[name].parent)

    with ThreadPoolExecutor(max_workers=len(packages)) as pool:
        return {name: pool.submit(build, name) for name in packages}


def test_autograd_formula_of_the_binding_on_cpu(tmp_path, stub_bindings):
    """The emitted binding's autograd (gemm_autograd.h's C++ formula, registered by binding.cpp for every op), built
    with stub kernels (stub_bindings) and run with CPU stand-in kernels: every op and backward op gets the binding's
    Autograd kernel; gradients (row-major, column-major, sliced and expanded dD) and double backward match float64;
    .out refuses grad. The real kernels are checked on the GPU (tests/gpu/test_emitted_package.py)."""
    pytest.importorskip("torch")
    name = AUTOGRAD_CPU
    plans = autograd_cpu_plans()
    ops = resolve_ops(plans)
    all_ops = [*ops, *backward_ops(ops)]
    env = stub_bindings[name].result()
    specs = {op.name: (op.config.dtype.value, op.config.out_dtype.value, op.config.layout.a.value,
                       op.config.layout.b.value, op.config.layout.c.value) for op in all_ops}
    takes = {op.name: (grouped_refusal(op.config) is None, grouped_list_refusal(op.config) is None) for op in all_ops}
    grads = {op.name: tuple(f"_grad_{c.name}" for c in backward_configs(op.config, Order.row)) for op in all_ops}
    code = AUTOGRAD_CHECK.format(name=name, cpu_kernels=CPU_KERNELS.format(specs=specs, name=name),
                                 grouped=GROUPED_GRADS.format(takes=takes, grads=grads, name=name))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # the sm90 plans (A row-major) take both forms; the sm80 ones neither
    checked = [(op, form) for op in ("gemm_bf16_tn", "gemm_fp16_tt") for form in ("grouped", "list")]
    assert f"GROUPED OK {checked}" in r.stdout and "AUTOGRAD OK" in r.stdout, r.stdout


# -- without torch ----------------------------------------------------------------------------------

@pytest.fixture
def no_torch_env(tmp_path):
    """An environment in which `import torch` raises ImportError (as in tests/test_no_torch.py)."""
    fake = tmp_path / "fake_site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("torch is hidden for this test")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_emit_works_without_torch(no_torch_env, tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from generator import Gemm, emit
        emit([Gemm("bf16", "tn", arch=90), Gemm("fp16", "nn", arch=80)], name="my_gemms", out={str(tmp_path / "api")!r})
        Gemm("bf16", "tt", arch=86).emit({str(tmp_path / "one")!r})
        Gemm("bf16", "tt", arch=86).emit({str(tmp_path / "noag")!r}, autograd=False)
        Gemm("bf16", "tn", arch=90, activation="gelu", bias="col").emit({str(tmp_path / "fused")!r})
        from generator.planner.backward import backward_closure  # the backward kernels are planned without torch too
        assert len(backward_closure([Gemm("bf16", "tn", arch=90).config])) == 4   # row-major D: tt, tn, nt, nn
        assert "torch" not in sys.modules
        try:
            import torch
        except ImportError:
            print("torch hidden")
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=no_torch_env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "torch hidden" in r.stdout
    assert (tmp_path / "api" / "csrc" / "binding.cpp").is_file() and (tmp_path / "one" / "one" / "__init__.py").is_file()
    assert "_grad_sm80_fp16_tn_" in (tmp_path / "api" / "csrc" / "binding.cpp").read_text()
    assert "AUTOGRAD = False" in (tmp_path / "noag" / "noag" / "__init__.py").read_text()
    fused = (tmp_path / "fused" / "fused" / "__init__.py").read_text()
    assert "def gemm_bf16_tn_gelu_cbias(A, B, bias, *, out=None):" in fused
    r = subprocess.run([sys.executable, "-m", "generator", "emit", "--plan", "dtype=bf16,layout=tn,arch=90",
                        "--plan", "dtype=fp16,layout=nn,arch=80", "--name", "my_gemms", "--out", str(tmp_path / "cli")],
                       cwd=ROOT, env=no_torch_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert tree(tmp_path / "cli") == tree(tmp_path / "api")


# -- the wheel: built once per session, without a GPU ---------------------------------------------------

WHEEL_PACKAGE = "gemmgen_wheel_test"
# A row-major-D sm80 op and an fp32, column-major-D sm90 op: one package with two gencodes compiles every
# kernel for both targets (nvcc flags are per package), so the sm90 kernel must build for compute_80 too.
# Emitted with autograd=False: the backward kernels (17 here, each for both targets) would more than double
# the build on 2 cores. The autograd registration of __init__.py is checked by test_autograd_formula_on_cpu,
# and on the GPU with a real build (tests/gpu/test_emitted_package.py).
WHEEL_AUTOGRAD = False
WHEEL_PLANS = [dict(dtype="bf16", layout="tn", arch=80),
               dict(dtype="fp16", layout="nt", arch=90, out_dtype="fp32", layout_c="col")]


def report_line(request, line: str) -> None:
    """Write one line to the terminal now, past pytest's output capture (the build time belongs in the log)."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(line)


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory, request):
    """Emit WHEEL_PLANS, `pip wheel` the package (MAX_JOBS=2, no GPU needed), install it into a target folder."""
    cuda_home = find_cuda_home()
    if cuda_home is None:
        pytest.skip("nvcc not found (set CUDA_HOME or put nvcc on PATH): cannot build the emitted package's wheel")
    try:
        import torch  # noqa: F401
        import torch.utils.cpp_extension  # noqa: F401
    except ImportError:
        pytest.skip("torch is not installed: the emitted package builds with torch.utils.cpp_extension")
    root = tmp_path_factory.mktemp("wheel")
    plans = [Gemm(**kw) for kw in WHEEL_PLANS]
    pkg = emit(plans, name=WHEEL_PACKAGE, out=root / WHEEL_PACKAGE, autograd=WHEEL_AUTOGRAD)
    env = dict(os.environ, MAX_JOBS="2", CUDA_HOME=str(cuda_home), PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                        str(root / "dist"), str(pkg)], cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    assert r.returncode == 0, f"pip wheel failed after {seconds:.0f} s:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
    wheels = sorted((root / "dist").glob("*.whl"))
    assert len(wheels) == 1, wheels
    report_line(request, f"[test_emit] pip wheel of the emitted package ({len(plans)} kernels + binding, "
                         f"MAX_JOBS=2): {seconds:.1f} s -> {wheels[0].name}")
    site = root / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site),
                        str(wheels[0])], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return {"wheel": wheels[0], "site": site, "seconds": seconds, "plans": plans, "root": root}


def run_installed(built: dict, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` where the installed package is importable and gemmgen is not (a fake `generator` refuses)."""
    fake = built["root"] / "no_generator" / "generator"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text('raise ImportError("generator is hidden for this test")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(built["site"]), str(fake.parent)])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=built["root"], env=env,
                          capture_output=True, text=True, timeout=300)


def test_wheel_builds_without_a_gpu(built_wheel):
    name = built_wheel["wheel"].name
    assert name.startswith(f"{WHEEL_PACKAGE}-0.1.0-") and name.endswith(".whl")
    assert "abi3" in name  # the binding uses Python's stable ABI only
    installed = sorted(p.relative_to(built_wheel["site"]).as_posix() for p in built_wheel["site"].rglob("*")
                       if p.is_file() and "dist-info" not in p.as_posix())
    assert f"{WHEEL_PACKAGE}/__init__.py" in installed
    assert any(re.fullmatch(rf"{WHEEL_PACKAGE}/_C\..*so", p) for p in installed), installed


def test_installed_package_registers_its_ops_and_checks_cpu_tensors(built_wheel):
    r = run_installed(built_wheel, f"""
        import sys
        import torch
        import {WHEEL_PACKAGE} as pkg
        assert "generator" not in sys.modules
        ops = ["gemm_bf16_tn", "gemm_fp16_nt_ofp32_dcol"]
        assert pkg.__all__ == ops, pkg.__all__
        assert pkg.AUTOGRAD is {WHEEL_AUTOGRAD}
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        assert all(has("{WHEEL_PACKAGE}::" + op, "Autograd") is {WHEEL_AUTOGRAD} for op in ops)
        for op in ops:
            packet = getattr(torch.ops.{WHEEL_PACKAGE}, op)
            assert sorted(packet.overloads()) == ["default", "grouped", "grouped_list", "masked", "out"], \
                packet.overloads()
            for overload in (packet.default, packet.out, packet.grouped, packet.grouped_list, packet.masked):
                assert torch.Tag.needs_fixed_stride_order in overload.tags, overload.tags
                assert torch.Tag.pt2_compliant_tag in overload.tags, overload.tags
            assert f"Kernel sm{{pkg.PLANS[op]['arch']}}_" in getattr(pkg, op).__doc__
        A = torch.randn(64, 32).bfloat16()
        B = torch.randn(48, 32).bfloat16().t()
        for call in (lambda: pkg.gemm_bf16_tn(A, B), lambda: torch.ops.{WHEEL_PACKAGE}.gemm_bf16_tn(A, B),
                     lambda: pkg.gemm_bf16_tn(A, B, out=torch.empty(64, 48).bfloat16())):
            try:
                call()
            except ValueError as err:
                assert "A is on cpu; this op runs on CUDA tensors: pass A.cuda()" == str(err), str(err)
            else:
                raise SystemExit("a CPU tensor was accepted")
        for call, error, message in [
            (lambda: pkg.gemm_bf16_tn(A.double(), B), TypeError,
             "A is torch.float64; this plan computes bf16: pass A.to(torch.bfloat16)"),
            (lambda: pkg.gemm_bf16_tn(A.float(), B), TypeError,
             "A is torch.float32; this plan computes bf16: pass A.to(torch.bfloat16) or plan with dtype='float32'"),
            (lambda: pkg.gemm_bf16_tn(A.half(), B), TypeError,
             "A is torch.float16; this plan computes bf16: pass A.to(torch.bfloat16) or plan with dtype='float16'"),
            (lambda: pkg.gemm_bf16_tn(A[None, None], B), ValueError,
             "A must be 2-D (M, K) or 3-D (batch, M, K); got shape (1, 1, 64, 32)"),
            (lambda: pkg.gemm_bf16_tn(A.to("meta"), B.to("meta"), out=torch.empty(3, 5, device="meta").bfloat16()),
             ValueError, "out has shape (3, 5); D = A @ B is (64, 48): pass torch.empty(64, 48, "
                         "dtype=torch.bfloat16, device='meta')"),
            # batched calls on meta tensors: the C++ Meta kernels (gemm_op.h's gemm_meta, gemm_out_meta)
            (lambda: pkg.gemm_bf16_tn(A.expand(3, 64, 32).to("meta"), B.expand(2, 32, 48).to("meta")), ValueError,
             "A is (3, 64, 32) and B is (2, 32, 48): their batch sizes must agree, or one be 1 (broadcast, as "
             "torch.matmul)"),
            (lambda: pkg.gemm_bf16_tn(A.expand(3, 64, 32).to("meta"), B.to("meta"),
                                      out=torch.empty(64, 48, device="meta").bfloat16()),
             ValueError, "out has shape (64, 48); D = A @ B is (3, 64, 48): pass torch.empty(3, 64, 48, "
                         "dtype=torch.bfloat16, device='meta')"),
            (lambda: pkg.gemm_bf16_tn([[1.0]], B), TypeError, "A must be a torch.Tensor, got list"),
            (lambda: pkg.gemm_bf16_tn(A, B, out=3), TypeError, "out must be a torch.Tensor, got int"),
        ]:
            try:
                call()
            except error as err:
                assert str(err) == message, str(err)
            else:
                raise SystemExit(f"no {{error.__name__}}: {{message}}")
        for a, b in ((A[None].expand(3, 64, 32), B), (A, B[None].expand(3, 32, 48)),
                     (A[None], B[None].expand(3, 32, 48))):
            d = pkg.gemm_bf16_tn(a.to("meta"), b.to("meta"))     # batch-contiguous, each D[b] row-major
            assert (tuple(d.shape), d.stride()) == ((3, 64, 48), (64 * 48, 48, 1)), (d.shape, d.stride())
        a = torch.empty(3, 32, 64, dtype=torch.float16, device="meta").transpose(1, 2)   # column-major A[b]
        d = pkg.gemm_fp16_nt_ofp32_dcol(a, torch.empty(32, 48, dtype=torch.float16, device="meta"))
        assert (tuple(d.shape), d.stride(), d.dtype) == ((3, 64, 48), (64 * 48, 1, 64), torch.float32), d.stride()
        print("CHECKS OK")
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CHECKS OK" in r.stdout


def test_installed_package_grouped_overload(built_wheel):
    """.grouped of the installed package (gemm_op.h's gemm_grouped, compiled into the wheel): the sm80 plan's op
    refuses it before any other check, with the JIT op's words, and so does the sm90 one (its A is column-major) on
    real, meta and fake tensors; inputs that require grad are refused by an Autograd kernel of its own in a package
    without autograd; the list form (.grouped_list, and the op called with two lists) likewise, which the sm90 op takes.
    (The checks and shapes of an accepting plan: tests/test_jit_runtime.py, same gemm_op.h.)"""
    plans = [Gemm(**kw) for kw in WHEEL_PLANS]
    refusal = f"gemm_bf16_tn: {grouped_refusal(plans[0].config)}"   # (the package's op name)
    layout_refusal = f"gemm_fp16_nt_ofp32_dcol: {grouped_refusal(plans[1].config)}"
    list_refusal = f"gemm_bf16_tn: {grouped_list_refusal(plans[0].config)}"
    assert "A row-major" in layout_refusal and grouped_list_refusal(plans[1].config) is None, layout_refusal
    r = run_installed(built_wheel, f"""
        import torch
        import {WHEEL_PACKAGE} as pkg
        from torch._subclasses.fake_tensor import FakeTensorMode

        def error(call):
            try:
                call()
            except Exception as err:
                return type(err).__name__, str(err)
            raise SystemExit("no error")

        dump = torch._C._dispatch_dump("{WHEEL_PACKAGE}::gemm_fp16_nt_ofp32_dcol.grouped")
        for key in ("CompositeExplicitAutograd[alias]", "Meta", "Autograd[alias]"):
            assert "binding.cpp" in dump.split(key + ": registered at ")[1].split("\\n")[0], (key, dump)
        offsets = torch.tensor([10, 10, 64], dtype=torch.int32)
        A, B = torch.randn(64, 32).bfloat16(), torch.randn(3, 48, 32).bfloat16().transpose(1, 2)
        for call in (lambda: pkg.gemm_bf16_tn.grouped(A, B, offsets),
                     lambda: torch.ops.{WHEEL_PACKAGE}.gemm_bf16_tn.grouped(A, B, offsets),
                     lambda: pkg.gemm_bf16_tn.grouped(A[None], B, offsets.float())):   # the plan first
            assert error(call) == ("ValueError", {refusal!r}), error(call)
        assert error(lambda: pkg.gemm_bf16_tn.grouped(A, B, [10, 64])) == (
            "TypeError", "offsets must be a torch.Tensor, got list")
        # The sm90 op's A is column-major, which grouped calls refuse (a group starts at any row): the plan's
        # refusal on real, meta and fake tensors alike; inputs that require grad are refused by its Autograd kernel.
        fn = pkg.gemm_fp16_nt_ofp32_dcol.grouped
        assert "grouped GEMM" in fn.__doc__ and "offsets" in fn.__doc__
        X, Y = torch.randn(32, 64).half().t(), torch.randn(3, 32, 48).half()   # A column-major, B's matrices row-major
        m = dict(device="meta")
        for args in ((X, Y, offsets), (X.to(**m), Y.to(**m), offsets.to(**m))):
            assert error(lambda: fn(*args)) == ("ValueError", {layout_refusal!r}), error(lambda: fn(*args))
        with FakeTensorMode():
            a = torch.empty(32, 7, dtype=torch.float16, device="cuda").t()
            b = torch.empty(3, 32, 48, dtype=torch.float16, device="cuda")
            assert error(lambda: fn(a, b, torch.empty(3, dtype=torch.int32, device="cuda")))[0] == "ValueError"
        wanting = X.to(**m).requires_grad_()
        assert error(lambda: fn(wanting, Y.to(**m), offsets.to(**m))) == (
            "RuntimeError", "gemm_fp16_nt_ofp32_dcol.grouped: grouped calls have no backward pass yet, but A "
                            "require(s) grad: call it under torch.no_grad() or with detached tensors")
        # The list form: the sm80 op refuses it first; the sm90 op takes its column-major A (each problem's maps
        # start at its own A): CPU tensors refused with the fix, meta tensors give each D[i] column-major fp32.
        for call in (lambda: pkg.gemm_bf16_tn([A, A], [B[0]]), lambda: pkg.gemm_bf16_tn.grouped_list([], [])):
            assert error(call) == ("ValueError", {list_refusal!r}), error(call)
        listed = pkg.gemm_fp16_nt_ofp32_dcol
        assert "list of problems" in listed.grouped_list.__doc__
        assert error(lambda: listed([X], [Y[0]])) == (
            "ValueError", "A[0] is on cpu; this op runs on CUDA tensors: pass A[0].cuda()")
        Ds = listed([X.to(**m), X[:5].to(**m)], [Y[0].to(**m), Y[1, :, :9].to(**m)])
        assert [(tuple(t.shape), t.stride(), t.dtype) for t in Ds] == [((64, 48), (1, 64), torch.float32),
                                                                      ((5, 9), (1, 5), torch.float32)], Ds
        assert error(lambda: listed([wanting], [Y[0].to(**m)])) == (
            "RuntimeError", "gemm_fp16_nt_ofp32_dcol.grouped_list: grouped calls have no backward pass yet, but A[0] "
                            "require(s) grad: call it under torch.no_grad() or with detached tensors")
        print("GROUPED OK")
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "GROUPED OK" in r.stdout


def test_installed_package_meta_shapes(built_wheel):
    r = run_installed(built_wheel, f"""
        import torch
        import {WHEEL_PACKAGE} as pkg
        from torch._subclasses.fake_tensor import FakeTensorMode
        meta = dict(device="meta")
        A = torch.empty(100, 32, dtype=torch.bfloat16, **meta)
        B = torch.empty(48, 32, dtype=torch.bfloat16, **meta).t()
        D = pkg.gemm_bf16_tn(A, B)
        assert (tuple(D.shape), D.stride(), D.dtype, D.device.type) == ((100, 48), (48, 1), torch.bfloat16, "meta"), D
        # fp16 nt with an fp32, column-major D
        A2 = torch.empty(32, 100, dtype=torch.float16, **meta).t()
        B2 = torch.empty(32, 48, dtype=torch.float16, **meta)
        D2 = torch.ops.{WHEEL_PACKAGE}.gemm_fp16_nt_ofp32_dcol(A2, B2)
        assert (tuple(D2.shape), D2.stride(), D2.dtype) == ((100, 48), (1, 100), torch.float32), (D2.shape, D2.stride())
        out = torch.empty(48, 100, dtype=torch.float32, **meta).t()
        assert pkg.gemm_fp16_nt_ofp32_dcol(A2, B2, out=out) is out
        try:
            pkg.gemm_bf16_tn(A, B[:16])
        except ValueError as err:
            assert "K must agree" in str(err), str(err)
        else:
            raise SystemExit("K mismatch accepted")
        with FakeTensorMode():  # what torch.compile traces with: CUDA fake tensors, no GPU needed
            a = torch.empty(7, 32, dtype=torch.bfloat16, device="cuda")
            b = torch.empty(48, 32, dtype=torch.bfloat16, device="cuda").t()
            d = pkg.gemm_bf16_tn(a, b)
            assert (tuple(d.shape), d.stride(), d.device.type) == ((7, 48), (48, 1), "cuda")
        # .out traced and functionalized on fake tensors (as AOTAutograd does under torch.compile): it
        # decomposes into the default overload and a copy; the kernel never runs (these are CPU tensors)
        class M(torch.nn.Module):
            def forward(self, a, b, out):
                return pkg.gemm_bf16_tn(a, b, out=out)

        a, b, out = torch.randn(64, 32).bfloat16(), torch.randn(48, 32).bfloat16().t(), torch.empty(64, 48).bfloat16()
        code = torch.export.export(M(), (a, b, out)).run_decompositions().graph_module.code
        assert "{WHEEL_PACKAGE}.gemm_bf16_tn.default(a, b)" in code and "aten.copy.default(out" in code, code

        # a dynamic M: the meta implementation keeps it symbolic (no guard, no specialization)
        class N(torch.nn.Module):
            def forward(self, a, b):
                return pkg.gemm_bf16_tn(a, b)

        ep = torch.export.export(N(), (a, b), dynamic_shapes={{"a": {{0: torch.export.Dim("m")}}, "b": None}})
        shape = ep.graph_module.graph.find_nodes(op="output")[0].args[0][0].meta["val"].shape
        assert not str(shape[0]).isdigit(), f"M was specialized: {{shape}}"
        print("META OK")
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "META OK" in r.stdout


# -- fused epilogues ----------------------------------------------------------------------------------

def scaled_gelu(acc, scale: ep.Row, C: ep.Matrix, alpha: ep.Scalar):
    h = scale * acc + alpha * C
    return ep.gelu(h), h


def epilogue_plans() -> list[Gemm]:
    """A plan made with knobs, one with a function (row, matrix and scalar operands, a second output, a
    column-major D) and a plain one."""
    return [Gemm("bf16", "tn", arch=90, activation="gelu", bias="col"),
            Gemm("fp16", "nt", arch=90, layout_c="col", epilogue=scaled_gelu),
            Gemm("bf16", "tn", arch=90)]


def epilogue_cpu_plans() -> list[Gemm]:
    """epilogue_plans, a quantized D with its amax (three outputs, forward only) and fp8 plans with per-block and per-row
    scales (their scaled grouped overloads, forward only): EPILOGUE_CPU's package."""
    return [*epilogue_plans(), Gemm("bf16", "tn", arch=90, out_dtype="e4m3", amax=True),
            Gemm("e4m3", "tn", arch=90, scale="block", tile_shape=(128, 256, 128)),
            Gemm("e4m3", "tn", arch=90, scale="row")]


KNOB_OP, PLAIN_OP, AMAX_OP = "gemm_bf16_tn_gelu_cbias", "gemm_bf16_tn", "gemm_bf16_tn_oe4m3_amax"
FP8_OP, FP8_ROW_OP = "gemm_e4m3_tn_obf16_scale_block", "gemm_e4m3_tn_obf16_scale_row"
FUNCTION_OP = "gemm_fp16_nt_dcol_gelu_rscale_mc_salpha_aux"


def test_a_scaled_plan_is_packaged_with_its_scale_tensors(tmp_path):
    """scale_a and scale_b of a per-tensor scaled epilogue: Tensor arguments of kind ScalarTensor, checked as
    tensors of shape (1,), shaped to 0-dim tensors by the package's formula."""
    from generator.spec.epilogue import with_scales

    plan = Gemm("bf16", "tn", arch=90, epilogue=with_scales(ep.from_knobs(activation="relu", bias="col"), "tensor"))
    out = emit([plan], name="scaled", out=tmp_path / "scaled")
    init, binding = (out / "scaled" / "__init__.py").read_text(), (out / "csrc" / "binding.cpp").read_text()
    compile(init, "__init__.py", "exec")
    op = "gemm_bf16_tn_scale_tensor_relu_cbias"
    schema = f"{op}(Tensor A, Tensor B, Tensor scale_a, Tensor scale_b, Tensor bias) -> Tensor"
    assert f'm.def("{schema}", kTags);' in binding
    assert ('{/*kind=*/gemmgen::OperandKind::ScalarTensor, /*name=*/"scale_a", /*dtype=*/c10::ScalarType::Float, '
            '/*dtype_name=*/"fp32", /*row=*/true},  // scale_a: one-element tensor (1,), fp32, read on the device'
            ) in binding
    assert '_check_epilogue_operands((scale_a, "scale_a", "(1,)"), (scale_b, "scale_b", "(1,)"), ' in init
    assert "    ep_scale_a = ep_scale_a.to(acc.dtype).reshape(())\n" in init


def test_an_epilogue_plan_is_packaged_with_its_operands(tmp_path):
    plans = epilogue_plans()
    out = emit(plans, name="fused", out=tmp_path / "fused")
    files = {rel: data.decode() for rel, data in tree(out).items() if not rel.startswith("csrc/") or
             rel == "csrc/binding.cpp"}
    init, binding, readme = files["fused/__init__.py"], files["csrc/binding.cpp"], files["README.md"]
    compile(init, "__init__.py", "exec")
    # the schemas take the operands; (D, aux) for the epilogue with a second output
    assert ('m.def("gemm_bf16_tn_gelu_cbias(Tensor A, Tensor B, Tensor bias) -> Tensor", kTags);' in binding)
    assert (f'm.def("{FUNCTION_OP}(Tensor A, Tensor B, Tensor scale, Tensor C, float alpha) -> (Tensor, Tensor)", '
            "kTags);" in binding)
    assert (f'm.def("{FUNCTION_OP}.out(Tensor A, Tensor B, Tensor scale, Tensor C, float alpha, *, Tensor(a!) out)'
            in binding)
    assert 'm.def("gemm_bf16_tn(Tensor A, Tensor B) -> Tensor", kTags);' in binding
    # the operand specs gemm_op.h's boxed kernels read the stack by
    assert ('{/*kind=*/gemmgen::OperandKind::Col, /*name=*/"bias", /*dtype=*/c10::ScalarType::BFloat16, '
            '/*dtype_name=*/"bf16", /*row=*/true},  // bias: per-column vector (N,), bf16') in binding
    assert ('{/*kind=*/gemmgen::OperandKind::Matrix, /*name=*/"C", /*dtype=*/c10::ScalarType::Half, '
            '/*dtype_name=*/"fp16", /*row=*/true},') in binding
    assert f"/*operands=*/k_{FUNCTION_OP}_operands,\n    /*aux=*/true," in binding
    for key, kernel in (("CompositeExplicitAutograd", "epilogue_kernel"), ("Meta", "epilogue_meta_kernel")):
        block = impl_block(binding, "fused", key)
        for op in (KNOB_OP, FUNCTION_OP):
            assert f'm.impl("{op}", gemmgen::{kernel}(&k_{op}));' in block, (key, op)
    assert 'm.impl("gemm_bf16_tn", GemmKernel{&k_gemm_bf16_tn});' in binding   # the plain op stays unboxed
    assert 'm.impl("gemm_bf16_tn", GemmAutogradKernel{&kgrad_gemm_bf16_tn});' in binding
    # differentiable: the default overload takes __init__.py's formula (no C++ Autograd kernel), .out refuses grad
    autograd = impl_block(binding, "fused", "Autograd")
    for op in (KNOB_OP, FUNCTION_OP):
        assert f'm.impl("{op}",' not in autograd and f"kgrad_{op}" not in binding
        assert (f'm.impl("{op}.out", gemmgen::epilogue_out_autograd_kernel(&k_{op}, /*backward_registered=*/true));'
                in autograd)
    # the backward kernels: A @ B's closure, and per epilogue op the kernel recomputing acc in fp32, each a
    # private op with the C++ formula (double backward goes through acc)
    record = json.loads(files["plans.json"])
    accs = [accumulator_config(p.config) for p in plans[:2]]
    assert record["backward_kernels"] == sorted({*backward_closure(p.config for p in plans), *(c.name for c in accs)})
    for acc, plan in zip(accs, plans):
        assert acc.out_dtype.value == "fp32" and acc.epilogue.is_identity and acc.layout == plan.config.layout
        assert f'm.impl("_grad_{acc.name}", GemmAutogradKernel{{&kgrad__grad_{acc.name}}});' in binding
    for op, plan, acc in ((KNOB_OP, plans[0], accs[0]), (FUNCTION_OP, plans[1], accs[1])):
        grads = {order: backward_configs(plan.config, order) for order in Order}
        forms = {o: autograd_form(plan.config, a, b) for o, (a, b) in grads.items()}
        rows = [f'    "{o.value}": ("_grad_{a.name}", "_grad_{b.name}", {forms[o].a_b_row}, {forms[o].b_a_row},\n'
                f'            {forms[o].a_transposed}, {forms[o].b_transposed}),' for o, (a, b) in grads.items()]
        assert "\n".join([f'_register_epilogue_autograd("{op}", _epilogue_{op}, "_grad_{acc.name}", {{', *rows, "})"]) \
            in init, op
        assert f"def _epilogue_{op}(acc, " in init
    assert init.count("_torch.library.register_autograd(") == 1 and "import torch.nn.functional as _F" in init
    # a batched call that wants a gradient is refused, in the words of gemmgen's formula (autograd.py)
    assert ('raise RuntimeError(f"{op}: batched calls (3-D A or B) have no backward pass yet, but {\', \'.join('
            'wanting)} "') in init
    # the docstrings state the expression and the operands
    fn_doc = init.split(f"def {FUNCTION_OP}(A, B, scale, C, alpha, *, out=None):")[1].split('"""')[1]
    assert fn_doc.startswith("D = gelu(scale * acc + alpha * C), acc = A @ B: fp16 (torch.float16) inputs")
    for line in ("aux = scale * acc + alpha * C  (second output, M x N, dtype and order of D): returned as (D, aux)",
                 "scale: per-row vector (M,), fp16 (torch.float16)",
                 "C: matrix (M, N), row-major, fp16 (torch.float16)",
                 "alpha: runtime scalar (fp32)", "Differentiable in A, B and the tensor operands"):
        assert line in fn_doc, line
    knob_doc = init.split(f"def {KNOB_OP}(A, B, bias, *, out=None):")[1].split('"""')[1]
    assert knob_doc.startswith("D = gelu(acc + bias), acc = A @ B") and "bias: per-column vector (N,), bf16" in knob_doc
    assert '"epilogue": "gelu(acc + bias)",' in init and '"differentiable": True,' in init
    assert "not differentiable" not in init.lower() and f"`{KNOB_OP}`: D = gelu(acc + bias)" in readme
    assert f"The ops with a fused epilogue (`{KNOB_OP}`, `{FUNCTION_OP}`) are differentiable in A, B" in readme
    assert f"| `{KNOB_OP}` | bf16 -> bf16, `D = gelu(acc + bias)` |" in readme
    # plans.json: the knobs of a knob plan, the structure of a function epilogue; both plan the same kernels again
    by_op = {p["op_name"]: p for p in record["plans"]}
    assert {k: by_op[KNOB_OP].get(k) for k in ("activation", "bias", "alpha", "beta", "epilogue")} == {
        "activation": "gelu", "bias": "col", "alpha": None, "beta": None, "epilogue": None}
    assert by_op[FUNCTION_OP]["epilogue_text"] == plans[1].epilogue.text and "activation" not in by_op[FUNCTION_OP]
    assert by_op[FUNCTION_OP]["epilogue"]["operands"][0] == {"name": "scale", "kind": "row", "dtype": "fp16",
                                                             "order": None}
    assert "epilogue" not in by_op[PLAIN_OP] and "epilogue_text" not in by_op[PLAIN_OP]
    again, names = load_plans_file(out / "plans.json")
    assert sorted(p.name for p in again) == sorted(p.name for p in plans)
    assert {p.name: p.epilogue for p in again} == {p.name: p.epilogue for p in plans}
    assert tree(emit(again, name="fused", out=tmp_path / "again", op_names=names)) == tree(out)
    r = subprocess.run([sys.executable, "-m", "generator", "emit", "--plans", str(out / "plans.json"),
                        "--name", "fused", "--out", str(tmp_path / "cli")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    if r.returncode == 0:   # (the command line may still refuse epilogue plans: generator/cli/emit.py)
        assert tree(tmp_path / "cli") == tree(out)


def impl_block(binding: str, name: str, key: str) -> str:
    """The body of binding.cpp's TORCH_LIBRARY_IMPL(<name>, <key>, m) block."""
    return binding.split(f"TORCH_LIBRARY_IMPL({name}, {key}, m) {{")[1].split("\n}\n")[0]


def test_an_epilogue_op_without_autograd_refuses_grad(tmp_path):
    files = {rel: data.decode() for rel, data in tree(emit(epilogue_plans(), name="fused", out=tmp_path / "fused",
                                                               autograd=False)).items() if not rel.endswith(".cu")}
    binding, init, readme = files["csrc/binding.cpp"], files["fused/__init__.py"], files["README.md"]
    autograd = impl_block(binding, "fused", "Autograd")
    for op in (KNOB_OP, FUNCTION_OP):   # both overloads refuse grad at the call, as before autograd=True could
        assert f'm.impl("{op}", gemmgen::epilogue_autograd_kernel(&k_{op}));' in autograd
        assert (f'm.impl("{op}.out", gemmgen::epilogue_out_autograd_kernel(&k_{op}, /*backward_registered=*/false));'
                in autograd)
    assert 'm.impl("gemm_bf16_tn",' not in autograd and "AutogradSpec" not in binding
    assert "register_autograd" not in init and "def _epilogue_" not in init and "import torch.nn.functional" not in init
    assert init.count('"differentiable": False,') == 2 and init.count("Not differentiable in this package") == 2
    assert f"The ops with a fused epilogue (`{KNOB_OP}`, `{FUNCTION_OP}`) refuse arguments that require grad" in readme
    assert json.loads(files["plans.json"])["backward_kernels"] == []
    compile(init, "__init__.py", "exec")


def test_the_backward_ops_of_epilogue_ops(tmp_path):
    """Per epilogue op the kernel recomputing acc joins A @ B's closure; deduplicated by kernel name (two epilogues
    of one plan share it, and a public op of the same config shares its kernel file), sorted; deterministic."""
    gelu, relu = (Gemm("bf16", "tn", arch=90, activation=a, bias="col") for a in ("gelu", "relu"))
    acc = accumulator_config(gelu.config)
    assert acc == accumulator_config(relu.config)   # the same GEMM: one acc op for both
    plain_fp32 = Gemm("bf16", "tn", arch=90, out_dtype="fp32")
    assert plain_fp32.config == acc
    grads = backward_ops(resolve_ops([gelu, relu, plain_fp32]))
    names = [op.name for op in grads]
    # acc's kernel and the closure's four (the 16-bit sm90 closure writes row-major D only)
    assert names == sorted(names) and len(set(op.config.name for op in grads)) == len(grads) == 5
    assert {op.config.name for op in grads} == {acc.name, *backward_closure([gelu.config])}
    assert next(op for op in grads if op.config == acc).name == f"_grad_{acc.name}"
    files = tree(emit([gelu, relu, plain_fp32], name="g", out=tmp_path / "a" / "g", op_names=["x", "y", "z"]))
    assert sum(1 for rel in files if rel.endswith(".cu")) == 2 + 5   # x's, y's and the backward's (z's is acc's)
    again = tree(emit([plain_fp32, relu, gelu], name="g", out=tmp_path / "b" / "g", op_names=["z", "y", "x"]))
    assert again == files


def test_plans_json_of_an_epilogue_refuses_what_no_longer_replans(tmp_path):
    out = emit(epilogue_plans(), name="fused", out=tmp_path / "fused", autograd=False)
    record = json.loads((out / "plans.json").read_text())
    by_op = {p["op_name"]: p for p in record["plans"]}
    by_op[FUNCTION_OP]["epilogue_text"] = "relu(acc)"
    (tmp_path / "text.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"records the epilogue 'relu\(acc\)' but its keys now give"):
        load_plans_file(tmp_path / "text.json")
    by_op[FUNCTION_OP]["epilogue"]["D"] = 99
    (tmp_path / "bad.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="plan 2: epilogue JSON: D is 99"):
        load_plans_file(tmp_path / "bad.json")
    by_op[KNOB_OP]["activation"] = "relu"    # a knob changed: the recorded kernel no longer follows
    del by_op[FUNCTION_OP]
    record["plans"] = list(by_op.values())
    (tmp_path / "knob.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"records kernel '{epilogue_plans()[0].name}' but its knobs now plan"):
        load_plans_file(tmp_path / "knob.json")


def test_an_epilogue_op_name_and_operand_names(tmp_path):
    from generator.emit import default_op_name
    from generator.spec.epilogue import Epilogue, Expr, Operand

    assert default_op_name(epilogue_plans()[0].config) == KNOB_OP
    assert default_op_name(epilogue_plans()[1].config) == FUNCTION_OP
    for name, why in (("_x", "a name starting with '_'"), ("lambda", "a Python keyword")):
        epilogue = Epilogue((Operand(name, "col"),), Expr("add", (Expr("acc"), Expr("operand", name=name))))
        plan = Gemm("bf16", "tn", arch=90, epilogue=epilogue)
        with pytest.raises(ValueError, match=f"the epilogue operand '{name}' of .* is {why}, which cannot be a "
                                             "parameter of the package's function: rename the operand"):
            emit(plan, name="bad", out=tmp_path / "bad")


#: Run where the package built with stub kernels is importable and gemmgen is not: its registrations, the
#: Python function's checks, the C++ checks that run on CPU and meta tensors (messages given by the JIT op's
#: Python checks, computed by the test), .out's refusal of grad, meta and fake shapes, .out's decomposition;
#: then, with CPU stand-in kernels (CPU_KERNELS), the gradients of __init__.py's formula (EPILOGUE_GRADS).
EPILOGUE_CHECK = '''
import sys

import torch
import {name} as pkg
from torch._subclasses.fake_tensor import FakeTensorMode

assert "generator" not in sys.modules
EXPECTED = {expected!r}
dump = torch._C._dispatch_dump
for op in ("{knob}", "{function}"):
    for overload in (op, op + ".out"):
        text = dump("{name}::" + overload)
        for key in ("CompositeExplicitAutograd[alias]", "Meta", "Autograd[alias]"):
            line = text.split(key + ": registered at ")[1].split("\\n")[0]
            # the default overload's formula: __init__.py's, by torch.library.register_autograd
            where = "torch/library.py" if (key, overload) == ("Autograd[alias]", op) else "binding.cpp"
            assert where in line and line.endswith("[ boxed ]"), (overload, key, line)
plain = dump("{name}::{plain}").split("CompositeExplicitAutograd[alias]: ")[1].split("\\n")[0]
assert plain.endswith("[ boxed unboxed ]"), plain
fn, aux_fn = pkg.{knob}, pkg.{function}


def error(call):
    try:
        call()
    except Exception as err:
        return type(err).__name__, str(err)
    raise SystemExit("no error")


a, b, bias = torch.randn(33, 24).bfloat16(), torch.randn(40, 24).bfloat16().t(), torch.randn(40).bfloat16()
on_cpu = ("ValueError", "A is on cpu; this op runs on CUDA tensors: pass A.cuda()")
assert error(lambda: fn(a, b, bias)) == on_cpu
assert error(lambda: torch.ops.{name}.{knob}(a, b, bias)) == on_cpu
assert error(lambda: fn(a, b, bias, out=torch.empty(33, 40).bfloat16())) == on_cpu
assert error(lambda: fn(a, b, 1.0)) == ("TypeError", "bias must be a torch.Tensor of shape (N,), got float")
x, y = torch.randn(24, 33).half().t(), torch.randn(24, 40).half()
scale, C = torch.randn(33).half(), torch.randn(33, 40).half()
assert error(lambda: aux_fn(x, y, scale, C, torch.tensor(2.0))) == ("TypeError", "alpha is a runtime scalar of the "
    "epilogue: pass a Python number, got Tensor (use float(t) for a one-element tensor)")
assert error(lambda: aux_fn(x, y, scale, C, True))[1].endswith("pass a Python number, got bool")
assert error(lambda: aux_fn(x, y, scale, C, 2.0, out=C)) == ("ValueError", "{function} has a second output (aux), "
    "which out= cannot receive: call it without out= (it returns (D, aux))")
assert error(lambda: torch.ops.{name}.{function}.out(x, y, scale, C, 2.0, out=C)) == EXPECTED["aux out"]
# differentiable: with grad, the default overload reaches the same checks through __init__.py's formula; .out
# refuses grad at the call, with aten's words, and goes on without grad mode
assert error(lambda: fn(a.clone().requires_grad_(), b, bias)) == on_cpu
assert error(lambda: aux_fn(x, y, scale, C.clone().requires_grad_(), 1.0))[1].startswith("A is on cpu")
for call in (lambda: fn(a.clone().requires_grad_(), b, bias, out=torch.empty(33, 40).bfloat16()),
             lambda: fn(a, b, bias.clone().requires_grad_(), out=torch.empty(33, 40).bfloat16())):
    assert error(call) == ("RuntimeError", "{knob}.out: functions with out=... arguments don't support automatic "
                           "differentiation, but one of the arguments requires grad: call the op without out= (its "
                           "backward is registered)"), error(call)
with torch.no_grad():
    assert error(lambda: fn(a.clone().requires_grad_(), b, bias, out=torch.empty(33, 40).bfloat16())) == on_cpu
# meta tensors: the outputs' shapes and strides, and the checks that need no data (the JIT op's words)
m = dict(device="meta")
A, B, BIAS = a.to(**m), b.to(**m), bias.to(**m)
D = fn(A, B, BIAS)
assert (tuple(D.shape), D.stride(), D.dtype) == ((33, 40), (40, 1), torch.bfloat16), (D.shape, D.stride())
X, Y, SCALE, CC = x.to(**m), y.to(**m), scale.to(**m), C.to(**m)
D, AUX = aux_fn(X, Y, SCALE, CC, 0.5)
assert [(tuple(t.shape), t.stride(), t.dtype) for t in (D, AUX)] == [((33, 40), (1, 33), torch.float16)] * 2
for label, call in [("bias float32", lambda: fn(A, B, BIAS.float())), ("bias 2-D", lambda: fn(A, B, BIAS[None])),
                    ("bias on cpu", lambda: fn(A, B, bias)), ("C 1-D", lambda: aux_fn(X, Y, SCALE, CC[0], 1.0)),
                    ("scale float64", lambda: aux_fn(X, Y, SCALE.double(), CC, 1.0))]:
    assert error(call) == EXPECTED[label], (label, error(call), EXPECTED[label])
# .grouped: the plain op's (differentiable in a package with autograd), none for an epilogue op
for op in ("{knob}", "{function}"):
    assert "grouped" not in getattr(torch.ops.{name}, op).overloads() and not hasattr(getattr(pkg, op), "grouped")
assert "grouped" in torch.ops.{name}.{plain}.overloads()
offsets = torch.tensor([5, 5, 33], dtype=torch.int32)
experts = torch.randn(3, 40, 24).bfloat16().transpose(1, 2)
assert error(lambda: pkg.{plain}.grouped(a, experts, offsets)) == on_cpu
D = pkg.{plain}.grouped(A, experts.to(**m), offsets.to(**m))
assert (tuple(D.shape), D.stride(), D.dtype) == ((33, 40), (40, 1), torch.bfloat16), (D.shape, D.stride())
# differentiable (the package has autograd): __init__.py's formula, whose backward refuses meta tensors (a trace)
D = pkg.{plain}.grouped(A, experts.to(**m).requires_grad_(), offsets.to(**m))
assert D.grad_fn is not None and D.shape == (33, 40)
assert error(lambda: D.sum().backward()) == (
    "RuntimeError", "{plain}.grouped: the backward of a grouped call reads the group sizes and the operands' "
                    "addresses on the host, which a traced backward (torch.compile, fake or meta tensors) cannot do "
                    "yet: keep the grouped call out of the compiled region (call it in a function decorated with "
                    "torch.compiler.disable), or compile without training through it")
# .masked: the plain op's (gemm_op.h's checks and Meta kernel), forward only whatever the package's autograd
for op in ("{knob}", "{function}"):
    assert "masked" not in getattr(torch.ops.{name}, op).overloads() and not hasattr(getattr(pkg, op), "masked")
slabs, counts = torch.randn(3, 8, 24).bfloat16(), torch.tensor([5, 0, 8], dtype=torch.int32)
assert error(lambda: pkg.{plain}.masked(slabs, experts, counts)) == on_cpu
SLABS, EXPERTS, COUNTS = slabs.to(**m), experts.to(**m), counts.to(**m)
for D in (pkg.{plain}.masked(SLABS, EXPERTS, COUNTS), torch.ops.{name}.{plain}.masked(SLABS, EXPERTS, COUNTS)):
    assert (tuple(D.shape), D.stride(), D.dtype) == ((3, 8, 40), (320, 40, 1), torch.bfloat16), (D.shape, D.stride())
masked_grad = ("RuntimeError", "{plain}.masked: masked calls have no backward pass yet, but B require(s) grad: call "
                               "it under torch.no_grad() (inference), or train through op.grouped(A, B, offsets), "
                               "which is differentiable")
assert error(lambda: pkg.{plain}.masked(SLABS, EXPERTS.clone().requires_grad_(), COUNTS)) == masked_grad
with torch.no_grad():
    assert pkg.{plain}.masked(SLABS, EXPERTS.clone().requires_grad_(), COUNTS).shape == (3, 8, 40)
for call, expected in [
    (lambda: pkg.{plain}.masked(SLABS, EXPERTS, [5, 0, 8]), ("TypeError", "counts must be a torch.Tensor, got list")),
    (lambda: pkg.{plain}.masked(SLABS, EXPERTS, COUNTS.float()),
     ("TypeError", "counts is torch.float32; the groups' row counts are int32: pass counts.to(torch.int32)")),
    (lambda: pkg.{plain}.masked(SLABS, EXPERTS, COUNTS[:2]),
     ("ValueError", "counts has 2 entries but B has 3 matrices (B.size(0)): pass one count per group")),
    (lambda: pkg.{plain}.masked(SLABS[0], EXPERTS, COUNTS),
     ("ValueError", "A has shape (8, 24); a masked call takes A 3-D (E, max_m, K): each group's rows in a slab of "
                    "max_m rows, the first counts[g] of them valid"))]:
    assert error(call) == expected, (error(call), expected)
with FakeTensorMode():   # what torch.compile traces with
    D, AUX = aux_fn(torch.empty(24, 7, device="cuda").half().t(), torch.empty(24, 40, device="cuda").half(),
                    torch.empty(7, device="cuda").half(), torch.empty(7, 40, device="cuda").half(), 1.0)
    assert (tuple(D.shape), D.stride(), AUX.stride(), D.device.type) == ((7, 40), (1, 7), (1, 7), "cuda")
# .grouped_list: the plain op's (gemm_op.h's checks and Meta kernel, __init__.py's formula), reached by the op with
# two lists too; none for an epilogue op
for op in ("{knob}", "{function}"):
    assert "grouped_list" not in getattr(torch.ops.{name}, op).overloads()
    assert not hasattr(getattr(pkg, op), "grouped_list")
plain_fn = pkg.{plain}
As, Bs = [a, a[:5]], [b, b[:, :7]]
MAs, MBs = [t.to(**m) for t in As], [t.to(**m) for t in Bs]
for call in (lambda: plain_fn(As, Bs), lambda: plain_fn.grouped_list(tuple(As), Bs),
             lambda: torch.ops.{name}.{plain}.grouped_list(As, Bs)):
    assert error(call) == ("ValueError", "A[0] is on cpu; this op runs on CUDA tensors: pass A[0].cuda()"), error(call)
for Ds in (plain_fn(MAs, MBs), plain_fn.grouped_list(MAs, MBs)):
    assert [(tuple(t.shape), t.stride(), t.dtype) for t in Ds] == [((33, 40), (40, 1), torch.bfloat16),
                                                                   ((5, 7), (7, 1), torch.bfloat16)], Ds
assert plain_fn([], []) == []
for call, expected in [
    (lambda: plain_fn.grouped_list(a, Bs), ("TypeError", "A must be a list (or tuple) of torch.Tensors, one matrix "
                                                         "per problem, got Tensor")),
    (lambda: plain_fn(As, [b, 3]), ("TypeError", "B[1] must be a torch.Tensor, got int")),
    (lambda: plain_fn(As, Bs, out=a), ("ValueError", "{plain}: a list call, op(As, Bs), returns a new D per problem "
                                                     "and takes no out= or epilogue operands: call it with the two "
                                                     "lists alone")),
    (lambda: plain_fn(MAs, MBs[:1]), ("ValueError", "A has 2 matrices but B has 1: pass one B per A")),
    (lambda: plain_fn(MAs, [MBs[0], MBs[1][1:]]), ("ValueError", "A[1] is (5, 24) and B[1] is (23, 7): K must agree "
                                                                 "(A[1]'s columns = B[1]'s rows); for x @ W.t() pass "
                                                                 "B[1] = W.t()")),
    (lambda: plain_fn([MAs[0], MAs[1][None]], MBs), ("ValueError", "A[1] must be 2-D (M, K) for a list call: one "
                                                                   "matrix per problem; got shape (1, 5, 24)")),
    (lambda: plain_fn(MAs, [MBs[0], MBs[1].half()]), ("TypeError", "B[1] is torch.float16; this plan computes bf16: "
                                                                   "pass B[1].to(torch.bfloat16) or plan with "
                                                                   "dtype='float16'")),
    (lambda: sum(t.sum() for t in plain_fn(MAs, [MBs[0], MBs[1].clone().requires_grad_()])).backward(),
     ("RuntimeError", "{plain}.grouped_list: the backward of a grouped call reads the group sizes and the operands' "
                      "addresses on the host, which a traced backward (torch.compile, fake or meta tensors) cannot "
                      "do yet: keep the grouped call out of the compiled region (call it in a function decorated with "
                      "torch.compiler.disable), or compile without training through it")),
]:
    assert error(call) == expected, (error(call), expected)
with FakeTensorMode() as mode:
    Ds = plain_fn([mode.from_tensor(t).to("cuda") for t in As], [mode.from_tensor(t).to("cuda") for t in Bs])
    assert [(tuple(t.shape), t.device.type) for t in Ds] == [((33, 40), "cuda"), ((5, 7), "cuda")]
# .grouped_scaled and .masked_scaled: the fp8 op with per-block scales (gemm_op.h's checks, Meta and Autograd
# kernels; the words are GemmOp's, compared with the JIT op's on the GPU: tests/gpu/test_emitted_dtypes.py)
fp8 = pkg.{fp8}
assert {{"grouped_scaled", "masked_scaled"}} <= set(torch.ops.{name}.{fp8}.overloads())
assert "grouped" not in torch.ops.{name}.{fp8}.overloads()
e4m3 = torch.float8_e4m3fn
xq, wq = torch.empty(33, 256, dtype=e4m3), torch.empty(3, 40, 256, dtype=e4m3).transpose(1, 2)
sa, sb, offsets = torch.ones(33, 2), torch.ones(3, 1, 2), torch.tensor([5, 5, 33], dtype=torch.int32)
assert error(lambda: fp8.grouped(xq, wq, offsets, sa, sb)) == on_cpu
XQ, WQ, SA, SB, OFFSETS = (t.to(**m) for t in (xq, wq, sa, sb, offsets))
for D in (fp8.grouped(XQ, WQ, OFFSETS, SA, SB), torch.ops.{name}.{fp8}.grouped_scaled(XQ, WQ, OFFSETS, SA, SB)):
    assert (tuple(D.shape), D.stride(), D.dtype) == ((33, 40), (40, 1), torch.bfloat16), (D.shape, D.stride())
SLABS8, SA8 = torch.empty(3, 16, 256, dtype=e4m3, **m), torch.ones(3, 16, 2, **m)
D = fp8.masked(SLABS8, WQ, COUNTS, SA8, SB)
assert (tuple(D.shape), D.dtype) == ((3, 16, 40), torch.bfloat16), D.shape
scaled_grad = ("RuntimeError", "{fp8}.grouped_scaled multiplies e4m3 operands and has no backward pass, but B "
                               "require(s) grad: call it under torch.no_grad(), or pass B.detach(); train through a "
                               "bf16 or tf32 plan")
for call, expected in [
    (lambda: fp8.grouped(XQ, WQ, OFFSETS, SA.double(), SB),
     ("TypeError", "scale_a is torch.float64 on meta; the scales are torch.float32 on A's device (meta)")),
    (lambda: fp8.masked(SLABS8, WQ, COUNTS, SA8, sb),
     ("TypeError", "scale_b is torch.float32 on cpu; the scales are torch.float32 on A's device (meta)")),
    (lambda: fp8.grouped(XQ, WQ, OFFSETS, [1.0], SB), ("TypeError", "scale_a must be a torch.Tensor, got list")),
    (lambda: fp8.grouped(XQ, WQ.float().requires_grad_().to(e4m3), OFFSETS, SA, SB), scaled_grad)]:
    assert error(call) == expected, (error(call), expected)
with torch.no_grad():
    assert fp8.grouped(XQ, WQ.float().requires_grad_().to(e4m3), OFFSETS, SA, SB).shape == (33, 40)
# per-row scales (torch._scaled_grouped_mm's rowwise form): scale_a (total_M,), scale_b (E, N); masked (E, max_m)
fp8_row = pkg.{fp8_row}
assert {{"grouped_scaled", "masked_scaled"}} <= set(torch.ops.{name}.{fp8_row}.overloads())
SA_ROW, SB_ROW = torch.ones(33, **m), torch.ones(3, 40, **m)
D = fp8_row.grouped(XQ, WQ, OFFSETS, SA_ROW, SB_ROW)
assert (tuple(D.shape), D.stride(), D.dtype) == ((33, 40), (40, 1), torch.bfloat16), (D.shape, D.stride())
D = fp8_row.masked(SLABS8, WQ, COUNTS, torch.ones(3, 16, **m), SB_ROW)
assert (tuple(D.shape), D.dtype) == ((3, 16, 40), torch.bfloat16), D.shape
assert error(lambda: fp8_row.grouped(XQ, WQ, OFFSETS, SA_ROW.half(), SB_ROW)) == (
    "TypeError", "scale_a is torch.float16 on meta; the scales are torch.float32 on A's device (meta)")
assert error(lambda: fp8_row.grouped(xq, wq, offsets, torch.ones(33), torch.ones(3, 40))) == on_cpu


class M(torch.nn.Module):
    def forward(self, a, b, bias, out):
        return fn(a, b, bias, out=out)


code = torch.export.export(M(), (a, b, bias, torch.empty(33, 40).bfloat16())).run_decompositions().graph_module.code
assert "{name}.{knob}.default(a, b, bias)" in code and "aten.copy.default(out" in code, code
{grads}
# a quantized D with its amax: three outputs, (M, N) e4m3, (M, ceil(N/128)) fp32 scales and a 0-dim fp32
Q, S, AMAX = pkg.{amax}(A, B)
assert [(tuple(t.shape), t.dtype) for t in (Q, S, AMAX)] == [
    ((33, 40), torch.float8_e4m3fn), ((33, 1), torch.float32), ((), torch.float32)], (Q, S, AMAX)
assert str(torch.ops.{name}.{amax}.default._schema).endswith("-> (Tensor, Tensor, Tensor)")
print("EPILOGUE OK")
'''

#: EPILOGUE_CHECK's second part: CPU kernels in place of the stubs, then every epilogue op's gradients (A, B and
#: every tensor operand; row-major, column-major and expanded upstream gradients; only some inputs requiring grad;
#: double backward) against float64 torch autograd of the same expression (the package's own function of it, which
#: tests/test_render_epilogue_python.py checks against generator.runtime.evaluate). The backward ops run as CPU
#: kernels that check dtype and storage order, so a formula passing an operand in the wrong order fails here.
EPILOGUE_GRADS = '''
{cpu_kernels}
OPERANDS = {operands!r}  # epilogue op -> [(kind, dtype, order)]
BOUND = {{torch.bfloat16: 1e-2, torch.float16: 5e-3}}
torch.manual_seed(0)


def stored(rows, cols, order, dtype):
    return (torch.randn(rows, cols) if order == "row" else torch.randn(cols, rows).t()).to(dtype)


def operand(kind, dtype, order, m, n):
    if kind == "scalar":
        return float(torch.empty(()).uniform_(0.5, 2.0))
    if kind in ("row", "col"):
        return torch.randn(m if kind == "row" else n).to(DTYPES[dtype])
    return stored(m, n, order, DTYPES[dtype])


def rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def upstream(kind, m, n, dtype):
    if kind == "row":
        return torch.randn(m, n).to(dtype)
    return torch.randn(n, m).to(dtype).t()


def tensors(values):
    return [v for v in values if isinstance(v, torch.Tensor)]


def outputs(result):
    return list(result) if isinstance(result, tuple) else [result]


for op, specs in OPERANDS.items():
    plan, fn, epilogue = pkg.PLANS[op], getattr(pkg, op), getattr(pkg, "_epilogue_" + op)
    dtype = DTYPES[plan["dtype"]]
    for (m, n, k), kind, wanted in (((33, 40, 24), "row", "all"), ((33, 40, 24), "col", "all"),
                                    ((17, 9, 65), "expanded", "all"), ((1, 5, 7), "row", "all"),
                                    ((30, 1, 40), "col", "A"), ((33, 40, 24), "row", "operands")):
        a, b = stored(m, k, plan["layout_a"], dtype), stored(k, n, plan["layout_b"], dtype)
        values = [operand(*spec, m, n) for spec in specs]
        inputs = {{"all": [a, b, *tensors(values)], "A": [a], "operands": tensors(values)}}[wanted]
        for t in inputs:
            t.requires_grad_()
        outs = outputs(fn(a, b, *values))
        a64, b64 = (t.detach().double().requires_grad_(t.requires_grad) for t in (a, b))
        values64 = [v.detach().double().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v
                    for v in values]
        refs = [t for t in epilogue(a64 @ b64, *values64) if t is not None]
        if kind == "expanded":   # upstream gradients of strides (0, 0)
            sum(t.float().sum() for t in outs).backward()
            sum(t.sum() for t in refs).backward()
        else:
            ups = [upstream(kind, m, n, t.dtype) for t in outs]
            torch.autograd.backward(outs, ups)
            torch.autograd.backward(refs, [u.double() for u in ups])
        for t, t64 in zip([a, b, *tensors(values)], [a64, b64, *tensors(values64)]):
            if not t.requires_grad:
                assert t.grad is None, op
                continue
            assert t.grad.dtype == t.dtype and t.grad.shape == t.shape, (op, t.grad.dtype, t.grad.shape)
            if t is a or t is b:   # dA and dB in A's and B's storage order
                assert _stored(t.grad, plan["layout_a" if t is a else "layout_b"]), (op, t.grad.stride())
            assert rel(t.grad, t64.grad) <= BOUND[dtype], (op, m, n, k, kind, wanted, rel(t.grad, t64.grad))
    # double backward: the gradients' own gradients (through acc's private op and the epilogue's second
    # derivatives), and the upstream gradients'
    m, n, k = 40, 56, 24
    a, b = stored(m, k, plan["layout_a"], dtype), stored(k, n, plan["layout_b"], dtype)
    values = [operand(*spec, m, n) for spec in specs]
    leaves = [a, b, *tensors(values)]
    for t in leaves:
        t.requires_grad_()
    outs = outputs(fn(a, b, *values))
    ups = [torch.randn(m, n).to(t.dtype).requires_grad_() for t in outs]
    firsts = torch.autograd.grad(outs, leaves, ups, create_graph=True)
    weights = [torch.randn(t.shape).to(dtype).double() for t in leaves]
    sum((g.double() * w).sum() for g, w in zip(firsts, weights)).backward()
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ups64 = [u.detach().double().requires_grad_() for u in ups]
    found = iter(leaves64[2:])
    values64 = [next(found) if isinstance(v, torch.Tensor) else v for v in values]
    refs = [t for t in epilogue(leaves64[0] @ leaves64[1], *values64) if t is not None]
    firsts64 = torch.autograd.grad(refs, leaves64, ups64, create_graph=True)
    sum((g * w).sum() for g, w in zip(firsts64, weights)).backward()
    for i, (t, t64) in enumerate(zip(leaves + ups, leaves64 + ups64)):
        assert rel(t.grad, t64.grad) <= BOUND[dtype], (op, "double backward", i, rel(t.grad, t64.grad))
    with torch.no_grad():   # no graph without grad mode
        assert all(t.grad_fn is None for t in outputs(fn(a, b, *values)))
print("GRADS OK")
'''


def _python_messages() -> dict[str, tuple[str, str]]:
    """What the JIT op's Python checks say for EPILOGUE_CHECK's bad calls (meta tensors, as there)."""
    torch = pytest.importorskip("torch")
    from generator.runtime.operands import check_static

    knob, function = epilogue_plans()[0].config.epilogue, epilogue_plans()[1].config.epilogue
    m = dict(device="meta")
    A, X = torch.empty(33, 24, dtype=torch.bfloat16, **m), torch.empty(33, 24, dtype=torch.float16, **m)
    bias = torch.empty(40, dtype=torch.bfloat16, **m)
    scale, C = torch.empty(33, dtype=torch.float16, **m), torch.empty(33, 40, dtype=torch.float16, **m)
    cases = {"bias float32": (knob, A, [bias.float()]), "bias 2-D": (knob, A, [bias[None]]),
             "bias on cpu": (knob, A, [torch.empty(40, dtype=torch.bfloat16)]),
             "C 1-D": (function, X, [scale, C[0], 1.0]), "scale float64": (function, X, [scale.double(), C, 1.0])}
    expected = {}
    for label, (epilogue, a, values) in cases.items():
        try:
            for operand, value in zip(epilogue.operands, values):
                check_static(operand, value, a)
        except (TypeError, ValueError) as err:
            expected[label] = (type(err).__name__, str(err))
        else:
            raise AssertionError(f"{label}: the Python checks accept it")
    expected["aux out"] = ("ValueError", f"{FUNCTION_OP}.out: the plan has a second output (aux), which out= cannot "
                                         "receive: call the op without out=")
    return expected


def test_epilogue_binding_on_cpu(tmp_path, stub_bindings):
    """The binding of a package with epilogue ops, built with stub kernels (stub_bindings, as the autograd test's):
    boxed kernels for every key, the same messages as the JIT op's Python checks where a CPU machine reaches
    them (CPU and meta tensors), .out's refusal of grad, meta and fake shapes, .out decomposed; then, with CPU
    stand-in kernels, the gradients of __init__.py's formula against float64 (EPILOGUE_GRADS). The kernels
    themselves are tests/gpu/test_emitted_epilogue.py's."""
    expected = _python_messages()
    name = EPILOGUE_CPU
    plans = epilogue_cpu_plans()
    ops = resolve_ops(plans)
    all_ops = [*ops, *backward_ops(ops)]
    env = stub_bindings[name].result()
    specs = {op.name: (op.config.dtype.value, op.config.out_dtype.value, op.config.layout.a.value,
                       op.config.layout.b.value, op.config.layout.c.value) for op in all_ops}
    operands = {op.name: [(o.kind, o.dtype.value, o.order.value if o.order else None)
                          for o in op.config.epilogue.operands]
                for op in ops if not op.config.epilogue.is_identity and not op.config.dtype.is_quantized}
    grads = EPILOGUE_GRADS.format(cpu_kernels=CPU_KERNELS.format(specs=specs, name=name), operands=operands)
    code = EPILOGUE_CHECK.format(name=name, knob=KNOB_OP, function=FUNCTION_OP, plain=PLAIN_OP, amax=AMAX_OP,
                                 fp8=FP8_OP, fp8_row=FP8_ROW_OP, expected=expected, grads=grads)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "GRADS OK" in r.stdout and "EPILOGUE OK" in r.stdout


def test_a_hinted_plan_s_backward_is_planned_for_its_shape(tmp_path):
    """A plan with size hints gets dA and dB kernels planned for its own backward problems (M x K x N and K x N x M),
    as the JIT ops do: at 256 rows of a 14336 x 4096 layer they differ from the unhinted ones, and the package's
    autograd spec names them and builds them."""
    from generator.planner import Problem

    plan = Gemm("bf16", "tn", arch=90, m=256, n=14336, k=4096)
    hinted = {o: backward_configs(plan.config, o, Problem(256, 14336, 4096)) for o in Order}
    assert any(hinted[o] != backward_configs(plan.config, o) for o in Order)
    files = tree(emit([plan], name="hinted", out=tmp_path / "pkg"))
    spec = autograd_specs(files["csrc/binding.cpp"].decode())["gemm_bf16_tn"]
    for order in Order:
        assert spec[order.value][:2] == tuple(f"_grad_{c.name}" for c in hinted[order])
        assert all(f"csrc/{c.name}.cu" in files for c in hinted[order])
