"""The renderer: pure and deterministic, readable output whose includes resolve under templates/, and PTX
wrappers that cite the PTX ISA section they follow."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from generator.spec.describe import describe
from generator import Gemm, KernelConfig
from generator import epilogue as ep
from generator.spec.config import source_operand
from generator.spec.arch import arch_spec
from generator.render import FAMILY_TEMPLATES, _environment, included_headers, render, template_context, templates_dir
from generator.planner.shipped import SHIPPED_ARCHS, shipped_configs
from generator.spec.types import DType, parse_layout

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = templates_dir()
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
GLOBAL_FN = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(')

CONFIGS = [
    Gemm("bf16", "tn", arch=80).config,
    Gemm("fp16", "nt", arch=90, family="sm80", m=16).config,
    Gemm("bf16", "nn", arch=80, out_dtype="fp32", tile_shape=(128, 128, 64), stages=3).config,
    Gemm("fp16", "tt", arch=80, layout_c="col", raster_group=1).config,
    Gemm("bf16", "tn", arch=90).config,
    Gemm("fp16", "nt", arch=90, m=16).config,
    Gemm("bf16", "nn", arch=90, out_dtype="fp32", schedule="pingpong", cluster_shape=(1, 2), raster="n").config,
    Gemm("fp16", "tt", arch=90, layout_c="col", schedule="ws", tile_shape=(256, 128, 64), raster_group=1).config,
]
# What each family's rendered kernel includes, at least.
FAMILY_HEADERS = {"sm80": {"common/launch.cuh", "sm80/gemm_kernel.cuh", "ptx/sm80.cuh"},
                  "sm90": {"common/launch.cuh", "sm90/launch.cuh", "sm90/gemm_kernel.cuh", "ptx/sm90.cuh"}}
# The Jinja context of each family: the contract between the Python side and the templates.
EPILOGUE_KEYS = {"epilogue_identity", "epilogue_text", "epilogue_operands", "epilogue_body", "epilogue_row_fields",
                 "epilogue_col_fields", "epilogue_row_loads", "epilogue_col_loads", "epilogue_cols_per_group",
                 "epilogue_has_matrix", "epilogue_prefetch",
                 "epilogue_uses_fast_math", "epilogue_source_slot", "epilogue_source_cuda", "epilogue_sourced_body",
                 "epilogue_sourced_straight_line", "epilogue_row_blocks_slot", "epilogue_col_blocks_slot"}
CONTEXT_KEYS = {
    "sm80": {"name", "description", "elem_cuda", "elem_b_cuda", "out_cuda", "bm", "bn", "bk", "wm", "wn", "stages", "raster_group",
             "a_k_major", "b_k_major", "d_row_major", "max_smem_bytes", *EPILOGUE_KEYS},
    "sm90": {"name", "description", "elem_cuda", "elem_b_cuda", "out_cuda", "bm", "bn", "bk", "stages", "cluster_m", "cluster_n",
             "schedule", "raster", "raster_group", "a_k_major", "b_k_major", "d_row_major", "max_smem_bytes",
             "promote", "stream_k", "amax", "staging_in_ring", "interleave_k", "swaps_tt", *EPILOGUE_KEYS},
}
IDS = [c.name for c in CONFIGS]


def only_source(cfg: KernelConfig) -> tuple[str, str]:
    files = render(cfg)
    assert list(files) == [f"{cfg.name}.cu"]
    return next(iter(files.items()))


# -- pure and deterministic ----------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_render_is_deterministic(cfg: KernelConfig) -> None:
    first = render(cfg)
    assert render(cfg) == first
    assert render(replace(cfg)) == first          # an equal config, not the same object
    _environment.cache_clear()                    # a fresh Jinja environment renders the same text
    assert render(cfg) == first


def test_render_is_the_same_in_another_process() -> None:
    """No dependence on hash seeds, dict order or anything else that differs between processes."""
    code = ("from generator import Gemm; from generator.render import render; import sys; "
            "cfgs = [Gemm('fp16', 'nt', arch=90, family='sm80', m=16).config, "
            "Gemm('fp16', 'nt', arch=90, m=16).config]; "
            "sys.stdout.write(''.join(render(c)[c.name + '.cu'] for c in cfgs))")
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out == only_source(CONFIGS[1])[1] + only_source(CONFIGS[5])[1]


def test_render_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in TEMPLATES.rglob("*")}
    render(CONFIGS[0])
    assert list(tmp_path.iterdir()) == []
    assert {p: p.stat().st_mtime_ns for p in TEMPLATES.rglob("*")} == before


def test_configs_that_differ_render_differently() -> None:
    texts = [only_source(c)[1] for c in CONFIGS]
    assert len(set(texts)) == len(texts)


def test_render_refuses_an_illegal_config() -> None:
    bad = replace(CONFIGS[0], tile=(96, 128, 32))
    with pytest.raises(ValueError, match="tile 96x128x32 is not one the sm80 template builds"):
        render(bad)


def test_plan_render_is_render_of_its_config() -> None:
    p = Gemm("bf16", "tn", arch=80)
    assert p.render() == render(p.config)


# -- what the generated file says ----------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_header_comment_states_the_config(cfg: KernelConfig) -> None:
    _, text = only_source(cfg)
    lines = text.splitlines()
    assert lines[0] == f"// {cfg.name}"
    header = []
    for line in lines:
        if not line.startswith("//"):
            break
        header.append(line)
    comment = "\n".join(header)
    for line in describe(cfg).splitlines():
        assert f"//   {line}" in header, line
    assert f"name:         {cfg.name}" in comment
    bm, bn, bk = cfg.tile
    assert f"tile:         {bm}x{bn}x{bk}" in comment
    assert f"stages:       {cfg.stages}" in comment
    assert f"arch:         sm_{cfg.arch}" in comment


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_kernel_name_is_the_global_function(cfg: KernelConfig) -> None:
    _, text = only_source(cfg)
    kernels = GLOBAL_FN.findall(text)
    assert cfg.name in kernels
    assert all(k.startswith(cfg.name) for k in kernels), kernels
    assert f"{cfg.name}_launch(" in text


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_constants_substituted(cfg: KernelConfig) -> None:
    _, text = only_source(cfg)
    bm, bn, bk = cfg.tile
    if cfg.family == "sm90":
        family = (("kClusterM", cfg.cluster[0]), ("kClusterN", cfg.cluster[1]))
        schedule = {"ws": "kWarpSpecialized", "cooperative": "kCooperative", "pingpong": "kPingpong"}[cfg.schedule]
        assert f"kSchedule = gemmgen::sm90::Schedule::{schedule};" in text
        assert f"kRasterAlongM = {str(cfg.raster == 'm').lower()};" in text
    else:
        family = (("kWarpsM", cfg.warps[0]), ("kWarpsN", cfg.warps[1]))
    for const, value in (("kBlockM", bm), ("kBlockN", bn), ("kBlockK", bk), *family, ("kStages", cfg.stages),
                         ("kRasterGroup", cfg.raster_group)):
        assert f"static constexpr int {const} = {value};" in text
    assert f"using Elem = {cfg.dtype.cuda_type};" in text
    assert f"using Out = {cfg.out_dtype.cuda_type};" in text
    assert f"kAKMajor = {str(cfg.layout.a_k_major).lower()};" in text
    assert f"kBKMajor = {str(cfg.layout.b_k_major).lower()};" in text
    assert f"kDRowMajor = {str(cfg.layout.c.value == 'row').lower()};" in text


def test_fp32_output_and_column_major_d() -> None:
    for fp32_out, col_d in ((CONFIGS[2], CONFIGS[3]), (CONFIGS[6], CONFIGS[7])):
        _, text = only_source(fp32_out)
        assert "using Out = float;" in text and "using Elem = __nv_bfloat16;" in text
        _, text = only_source(col_d)
        assert "kDRowMajor = false;" in text


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_template_context_is_the_contract(cfg: KernelConfig) -> None:
    context = template_context(cfg)
    assert set(context) == CONTEXT_KEYS[cfg.family]
    assert context["description"] == describe(cfg).splitlines()
    assert context["max_smem_bytes"] == arch_spec(cfg.arch).smem_per_block  # the kernel's static_assert bound
    if cfg.family == "sm90":
        assert (context["cluster_m"], context["cluster_n"]) == cfg.cluster
        assert context["schedule"] in ("ws", "cooperative", "pingpong") and context["raster"] in ("m", "n")
        assert FAMILY_TEMPLATES["sm90"] == "sm90/gemm.cu.j2"


def test_sm90_context_values() -> None:
    cfg = CONFIGS[6]
    context = template_context(cfg)
    assert {k: context[k] for k in ("bm", "bn", "bk", "cluster_m", "cluster_n", "schedule", "raster", "elem_cuda",
                                    "out_cuda", "a_k_major", "b_k_major", "d_row_major")} == {
        "bm": cfg.tile[0], "bn": cfg.tile[1], "bk": 64, "cluster_m": 1, "cluster_n": 2, "schedule": "pingpong",
        "raster": "n", "elem_cuda": "__nv_bfloat16", "out_cuda": "float", "a_k_major": False, "b_k_major": True,
        "d_row_major": True}


@pytest.mark.parametrize("arch", SHIPPED_ARCHS)
def test_every_shipped_config_renders_readably(arch: int) -> None:
    for cfg in shipped_configs(arch):
        _, text = only_source(cfg)
        assert text.startswith(f"// {cfg.name}\n")
        assert text.endswith("\n") and not text.endswith("\n\n\n")
        assert "\t" not in text
        assert all(line == line.rstrip() for line in text.splitlines()), "trailing whitespace"
        assert "{{" not in text and "{%" not in text, "unrendered Jinja"


# -- includes resolve under templates/ --------------------------------------------------------------


def _resolve(include: str, including_dir: Path | None) -> Path | None:
    """Where nvcc finds `#include "include"`: beside the including file first, then -I templates/."""
    for base in ([including_dir] if including_dir else []) + [TEMPLATES]:
        path = (base / include).resolve()
        if path.is_file():
            return path
    return None


def _is_under_templates(path: Path) -> bool:
    try:
        path.relative_to(TEMPLATES.resolve())
        return True
    except ValueError:
        return False


def _closure(text: str, including_dir: Path | None) -> set[Path]:
    """Every header reachable from `text` through quoted includes; fails on one that does not resolve."""
    seen: set[Path] = set()
    todo = [(text, including_dir, "<rendered>")]
    while todo:
        source, here, who = todo.pop()
        for inc in INCLUDE.findall(source):
            path = _resolve(inc, here)
            assert path is not None, f'{who}: #include "{inc}" does not resolve under {TEMPLATES}'
            assert _is_under_templates(path), f'{who}: #include "{inc}" resolves outside templates/: {path}'
            if path not in seen:
                seen.add(path)
                todo.append((path.read_text(), path.parent, str(path.relative_to(TEMPLATES.resolve()))))
    return seen


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_rendered_includes_resolve_under_templates(cfg: KernelConfig) -> None:
    _, text = only_source(cfg)
    assert INCLUDE.findall(text), "the kernel includes its headers"
    reached = _closure(text, None)  # the rendered file is written elsewhere: only -I templates/ helps it
    assert {p.relative_to(TEMPLATES.resolve()).as_posix() for p in reached} >= FAMILY_HEADERS[cfg.family]
    assert reached <= {p.resolve() for p in included_headers()}, "emit would not copy every included header"


def test_every_header_include_resolves_under_templates() -> None:
    headers = [p for p in TEMPLATES.rglob("*") if p.suffix in (".h", ".cuh", ".j2")]
    assert headers
    for header in headers:
        _closure(header.read_text(), header.parent)


def test_headers_have_pragma_once() -> None:
    for header in included_headers():
        assert "#pragma once" in header.read_text(), header


# -- PTX wrappers cite the PTX ISA ---------------------------------------------------------------

_TOP_LEVEL_DECL = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:struct\s+(\w+)|__device__\b[^(]*?\b(\w+)\s*\()")


def _helper_name(lines: list[str], asm_line: int) -> tuple[str, int]:
    """The top-level helper (function or struct) an `asm volatile` at asm_line belongs to."""
    for i in range(asm_line, -1, -1):
        line = lines[i]
        if line and not line[0].isspace():
            m = _TOP_LEVEL_DECL.match(line)
            if m:
                return m.group(1) or m.group(2), i
    raise AssertionError(f"no helper function around line {asm_line + 1}")


def _first_declaration(lines: list[str], name: str) -> int:
    pattern = re.compile(rf"^(?:template\s*<[^>]*>\s*)?(?:struct\s+{name}\b|__device__\b[^(]*\b{name}\s*\()")
    return next(i for i, line in enumerate(lines) if pattern.match(line))


def _comment_above(lines: list[str], decl: int) -> list[str]:
    i = decl - 1
    while i >= 0 and lines[i].startswith("template"):
        i -= 1
    comment = []
    while i >= 0 and lines[i].lstrip().startswith("//"):
        comment.append(lines[i])
        i -= 1
    return comment[::-1]


PTX_HEADERS = sorted((TEMPLATES / "ptx").glob("*.cuh"))


def test_there_are_ptx_headers() -> None:
    assert PTX_HEADERS


@pytest.mark.parametrize("header", PTX_HEADERS, ids=[p.name for p in PTX_HEADERS])
def test_each_ptx_wrapper_cites_the_ptx_isa(header: Path) -> None:
    lines = header.read_text().splitlines()
    asm_lines = [i for i, line in enumerate(lines) if "asm volatile" in line or re.search(r"\basm\s*\(", line)]
    assert asm_lines, f"{header.name} wraps no PTX"
    helpers = {}
    for i in asm_lines:
        name, _ = _helper_name(lines, i)
        helpers[name] = _first_declaration(lines, name)
    for name, decl in helpers.items():
        comment = _comment_above(lines, decl)
        assert any(re.search(r"PTX ISA §\d+(\.\d+)*", c) for c in comment), (
            f"{header.name}: helper {name} (line {decl + 1}) has no 'PTX ISA §' citation in the comment above it")
    # The sm80 family needs at least these wrappers (ldmatrix is shared with sm90's epilogue).
    if header.name == "sm80.cuh":
        assert {"cp_async_16_zfill", "cp_async_commit", "cp_async_wait", "MmaM16N8K16"} <= set(helpers)
    if header.name == "smem.cuh":
        assert {"ldmatrix_x4", "ldmatrix_x4_trans", "ld_shared_v2_f32", "st_shared_v2_f32"} <= set(helpers)


def test_no_inline_ptx_outside_ptx_headers() -> None:
    """Inline PTX lives in the cited wrappers, so every kernel reuses them."""
    for path in TEMPLATES.rglob("*"):
        if path.suffix in (".h", ".cuh", ".j2") and path.parent.name != "ptx":
            assert "asm volatile" not in path.read_text() and not re.search(r"\basm\s*\(", path.read_text()), path


def test_citation_checker_catches_a_missing_citation() -> None:
    """The checker itself: a wrapper with a plain comment fails it."""
    lines = ["// Just a comment.", "__device__ __forceinline__ void f() { asm volatile(\"exit;\"); }"]
    name, _ = _helper_name(lines, 1)
    assert name == "f"
    assert not any("PTX ISA §" in c for c in _comment_above(lines, _first_declaration(lines, name)))


def test_kernel_config_fields_reach_the_template() -> None:
    cfg = KernelConfig(arch=80, dtype=DType.fp16, out_dtype=DType.bf16, layout=parse_layout("nt"),
                       tile=(64, 128, 64), warps=(2, 2), stages=3, raster_group=16)
    _, text = only_source(cfg)
    assert cfg.name == "sm80_fp16_nt_64x128x64_w2x2_s3_g16_obf16"
    assert "kAKMajor = false;" in text and "kBKMajor = false;" in text


def test_sm90_kernel_config_fields_reach_the_template() -> None:
    cfg = KernelConfig(arch=90, dtype=DType.fp16, out_dtype=DType.bf16, layout=parse_layout("nt"),
                       tile=(64, 128, 64), warps=None, stages=3, raster_group=16, family="sm90", cluster=(1, 2),
                       schedule="pingpong", raster="n")
    _, text = only_source(cfg)
    assert cfg.name == "sm90_fp16_nt_64x128x64_c1x2_s3_pp_g16n_obf16"
    assert "kAKMajor = false;" in text and "kBKMajor = false;" in text
    assert "kClusterN = 2;" in text and "kRasterGroup = 16;" in text and "kRasterAlongM = false;" in text


# -- the epilogue's source operand ------------------------------------------------------------------


def _two_matrices(acc, R: ep.Matrix(dtype="fp32"), C: ep.Matrix):
    return acc * R + C


@pytest.mark.parametrize("knobs, family, slot", [
    ({"alpha": 2.0, "beta": 0.5}, "sm90", 0),
    ({"alpha": 2.0, "beta": 0.5, "out_dtype": "fp32"}, "sm90", 0),       # fp32 C beside fp32 D
    ({"alpha": 2.0, "beta": 0.5, "layout_c": "col"}, "sm90", None),      # the staging buffers serve a row-major D
    ({"epilogue": _two_matrices}, "sm90", 1),                            # fp32 R is not D's width: C is the source
    ({"epilogue": _two_matrices}, "sm80", 0),                            # sm80 reads pairs of any width
    ({"activation": "relu", "bias": "col"}, "sm90", None),               # no M x N operand
])
def test_source_operand(knobs, family, slot) -> None:
    cfg = Gemm("bf16", "tn", arch=90, family=family, **knobs).config
    assert source_operand(cfg) == slot
    text = only_source(cfg)[1]
    assert ("static float apply_sourced(" in text) == (slot is not None)
    assert f"static constexpr int kSourceSlot = {-1 if slot is None else slot};" in text


def test_sourced_functor_takes_the_source_as_an_argument() -> None:
    cfg = Gemm("bf16", "tn", arch=90, alpha=2.0, beta=0.5).config
    context = template_context(cfg)
    assert "const float ep_C = source;" in context["epilogue_sourced_body"]
    assert not any("source" in line for line in context["epilogue_body"])  # apply reads C from memory itself
    assert context["epilogue_sourced_straight_line"] and context["epilogue_has_matrix"]


def test_column_major_source_is_read_element_by_element() -> None:
    def fused(acc, C: ep.Matrix(order="col")):
        return acc + C

    for family in ("sm80", "sm90"):
        cfg = Gemm("bf16", "tn", arch=90, family=family, epilogue=fused).config
        assert source_operand(cfg) is None


# -- the functor of fp8 scales: scalar tensors once per row, per-block scales left to the main loop -------------

from generator.render.epilogue import functor_context, operand_load  # noqa: E402
from generator.spec.epilogue import IDENTITY, with_scales  # noqa: E402


def _functor(epilogue: ep.Epilogue) -> str:
    """The Epilogue struct the families' templates include, for a resolved epilogue."""
    return _environment().get_template("common/epilogue_functor.cuh.j2").render(**functor_context(epilogue, True))


@pytest.mark.parametrize("family", ["sm80", "sm90"])
def test_every_functor_names_the_block_scale_slots(family) -> None:
    for knobs in ({}, {"activation": "relu", "bias": "col"}):
        text = only_source(Gemm("bf16", "tn", arch=90, family=family, **knobs).config)[1]
        for line in ("static constexpr int kRowBlocksSlot = -1;", "static constexpr int kColBlocksSlot = -1;",
                     "static constexpr int kScaleBlockK = GEMMGEN_SCALE_BLOCK_K;"):
            assert text.count(line) == 1, (knobs, line)


def test_scalar_tensor_is_read_once_per_row() -> None:
    scaled = with_scales(ep.from_knobs(activation="gelu", bias="col"), "tensor")
    cfg = Gemm("bf16", "tn", arch=90, epilogue=scaled).config
    context = template_context(cfg)
    assert context["epilogue_row_loads"] == ["v.ep_scale_a = gemmgen::epi::load<float>(args.ep_ptr[0], 0);",
                                             "v.ep_scale_b = gemmgen::epi::load<float>(args.ep_ptr[1], 0);"]
    assert context["epilogue_row_fields"] == ["float ep_scale_a;", "float ep_scale_b;"]
    assert context["epilogue_col_loads"] == ["v.ep_bias = gemmgen::epi::load<__nv_bfloat16>(args.ep_ptr[2], col);"]
    body = context["epilogue_body"]
    assert body[:2] == ["const float ep_scale_a = r.ep_scale_a;", "const float ep_scale_b = r.ep_scale_b;"]
    assert not any("args.ep_ptr" in line for line in body)      # nothing read per element
    assert body[3:5] == ["const float t0 = acc * ep_scale_a;", "const float t1 = t0 * ep_scale_b;"]
    assert (context["epilogue_row_blocks_slot"], context["epilogue_col_blocks_slot"]) == (-1, -1)
    text = only_source(cfg)[1]
    assert "//   slot 0: scale_a: one-element tensor (1,), fp32, read on the device" in text


def test_row_scales_are_fp32_vectors() -> None:
    cfg = Gemm("bf16", "tn", arch=90, family="sm80", epilogue=with_scales(IDENTITY, "row")).config
    context = template_context(cfg)
    assert context["epilogue_row_loads"] == ["v.ep_scale_a = gemmgen::epi::load<float>(args.ep_ptr[0], row);"]
    assert context["epilogue_col_loads"] == ["v.ep_scale_b = gemmgen::epi::load<float>(args.ep_ptr[1], col);"]


def test_block_scales_are_not_loaded_by_the_functor() -> None:
    scaled = with_scales(ep.from_knobs(activation="relu", bias="col"), "block").resolved("bf16")
    context = functor_context(scaled, True)
    assert (context["epilogue_row_blocks_slot"], context["epilogue_col_blocks_slot"]) == (0, 1)
    assert not context["epilogue_identity"]
    lines = [*context["epilogue_body"], *context["epilogue_row_loads"], *context["epilogue_col_loads"],
             *context["epilogue_prefetch"], *context["epilogue_row_fields"], *context["epilogue_col_fields"]]
    assert not any("scale_" in line or "ep_ptr[0]" in line or "ep_ptr[1]" in line for line in lines), lines
    assert context["epilogue_body"][0] == "const float ep_bias = c.ep_bias;"
    text = _functor(scaled)
    assert "static constexpr int kRowBlocksSlot = 0;" in text and "static constexpr int kColBlocksSlot = 1;" in text
    assert "//   slot 0: scale_a: per-block scales of A (M, ceil(K/128)), fp32, row-major (main loop)" in text
    with pytest.raises(ValueError, match="read by the kernel's main loop"):
        operand_load(0, scaled.operands[0])


def test_block_scales_alone_leave_the_functor_the_identity() -> None:
    """D = acc once the main loop has applied the scales: the kernels skip the epilogue, and still find the slots."""
    text = _functor(with_scales(IDENTITY, "block"))
    assert "static constexpr bool kIdentity = true;" in text
    assert "static constexpr int kRowBlocksSlot = 0;" in text and "static constexpr int kColBlocksSlot = 1;" in text
    assert "static constexpr int kScaleBlockK = GEMMGEN_SCALE_BLOCK_K;" in text and "apply(" not in text
    assert "static constexpr bool kIdentity = true;" not in _functor(with_scales(IDENTITY, "tensor"))


def test_only_a_plain_tf32_tt_library_carries_the_transposed_product() -> None:
    """The transposed product's kernel (render.swaps_tt, spec.config.transposed_product): tf32 with a K-major A and an
    N-major B and an identity epilogue; not other layouts or types, nor an epilogue with operands (which the swap does
    not exchange)."""
    from generator.render import swaps_tt

    assert swaps_tt(Gemm("fp32", "tt", arch=90).config)
    assert "SwappedConfig" in next(iter(render(Gemm("fp32", "tt", arch=90).config).values()))
    for plan in (Gemm("fp32", "tn", arch=90), Gemm("fp32", "nt", arch=90), Gemm("bf16", "tt", arch=90),
                 Gemm("fp32", "tt", arch=90, activation="gelu", bias="col")):
        assert not swaps_tt(plan.config), plan.name
        assert "SwappedConfig" not in next(iter(render(plan.config).values())), plan.name
