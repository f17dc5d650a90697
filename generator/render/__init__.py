"""render(config) -> {file name: source text}. Pure: no torch, no GPU, no files written.

The generated translation unit includes the plain CUDA headers under templates/ by relative path
(``#include "sm80/gemm_kernel.cuh"``); the builder passes ``-I <templates dir>`` and ``emit`` copies them.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

import jinja2

from ..spec.arch import arch_spec
from ..spec.config import KernelConfig, check_config, source_operand, transposed_product
from ..spec.describe import describe
from .epilogue import functor_context

#: Templates per kernel family: the Jinja file rendered into the kernel's translation unit.
FAMILY_TEMPLATES = {"sm80": "sm80/gemm.cu.j2", "sm90": "sm90/gemm.cu.j2"}


def templates_dir() -> Path:
    """templates/ next to generator/ in a source checkout, or the installed copy (package gemmgen_templates)."""
    beside = Path(__file__).resolve().parents[2] / "templates"
    if beside.is_dir():
        return beside
    spec = importlib.util.find_spec("gemmgen_templates")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the CUDA templates are missing: reinstall the package (pip install -e .)")
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,  # a missing constant is an error, never an empty string
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )


def template_context(cfg: KernelConfig) -> dict[str, object]:
    """The constants the family's template substitutes (the contract between Python and CUDA sides)."""
    bm, bn, bk = cfg.tile
    common = {
        "name": cfg.name,
        "description": describe(cfg).splitlines(),
        "elem_cuda": cfg.dtype.cuda_type,
        "elem_b_cuda": cfg.b_dtype.cuda_type,
        "out_cuda": cfg.out_dtype.cuda_type,
        "bm": bm, "bn": bn, "bk": bk,
        "stages": cfg.stages,
        "max_smem_bytes": arch_spec(cfg.arch).smem_per_block,  # the opt-in limit per block of the plan's arch
    }
    layout = {
        "a_k_major": cfg.layout.a_k_major,
        "b_k_major": cfg.layout.b_k_major,
        "d_row_major": cfg.layout.c.value == "row",
    }
    common.update(functor_context(cfg.epilogue, d_row_major=layout["d_row_major"],
                                  source_slot=source_operand(cfg)))
    if cfg.family == "sm90":
        return {**common,
                "cluster_m": cfg.cluster[0], "cluster_n": cfg.cluster[1],
                "schedule": cfg.schedule,           # "ws" | "cooperative" | "pingpong"
                "raster": cfg.raster,               # "m" | "n"
                "promote": cfg.promoted,            # fp8: each k tile added into fp32 accumulators
                "stream_k": cfg.stream_k,
                "amax": cfg.amax,
                "staging_in_ring": cfg.staging_in_ring,
                "interleave_k": cfg.interleave_k,
                "raster_group": cfg.raster_group,
                "swaps_tt": swaps_tt(cfg),         # GEMMGEN_SM90_TF32_TT_SWAPPED's transposed product
                **layout}
    return {**common, "wm": cfg.warps[0], "wn": cfg.warps[1], "raster_group": cfg.raster_group, **layout}


def swaps_tt(cfg: KernelConfig) -> bool:
    """Whether an sm90 library also builds the transposed product's kernel (spec.config.transposed_product), which
    templates/sm90/launch.cuh takes_swapped launches unless GEMMGEN_SM90_TF32_TT_SWAPPED=0."""
    return transposed_product(cfg) is not None


def render(cfg: KernelConfig) -> dict[str, str]:
    """The kernel's sources: ``{"<name>.cu": text}``. Headers it includes stay in templates_dir()."""
    check_config(cfg)
    template = _environment().get_template(FAMILY_TEMPLATES[cfg.family])
    return {f"{cfg.name}.cu": template.render(**template_context(cfg))}


def included_headers() -> list[Path]:
    """Every plain header a rendered kernel may include (what emit copies beside the sources)."""
    root = templates_dir()
    return sorted(p for p in root.rglob("*") if p.suffix in (".h", ".cuh"))
