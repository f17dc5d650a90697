"""nvcc compiles the rendered kernels of the shipped configs, and ptxas reports no spills and no stack frame
in any entry function: the sm80 family for sm_80 (planned for arch 80) and for sm_90a (planned for arch 90
with family="sm80"), the sm90 family for sm_90a only (wgmma and TMA exist nowhere else).

Each kind of shipped kernel compiles, not each shipped config (see representative()): every kernel shape in every
layout for its target, while the bf16 and fp16 twins of a kernel (which differ only in the mma/wgmma type) and where
thread blocks go (cluster, raster) are dealt across the layouts; the sm80 family on sm_90a, whose layouts and
placements its sm_80 cases compile, each kernel shape once (one_per_shape).
test_the_compiled_kernels_cover_the_shipped_ones checks that this holds for whatever the planner ships.

CPU only (ptxas needs no GPU). The compiles run in parallel, one nvcc per kernel straight to a .cubin:
the point is ptxas's resource report, and a cubin skips the host compiler and the linker that a
loadable library needs. Device flags are the builder's (generator/toolchain/builder.py: -O3 -std=c++17 -lineinfo).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest

from generator import Gemm
from generator import epilogue as ep
from generator.spec.arch import ARCHS
from generator.spec.config import KernelConfig
from generator.spec.epilogue import with_scales
from generator.render import render, templates_dir
from generator.planner.shipped import SHIPPED_ARCHS, shipped_configs

# The flags of generator/toolchain/builder.py that change device code; -cubin replaces -shared -Xcompiler -fPIC.
DEVICE_FLAGS = ["-O3", "-std=c++17", "-lineinfo", "-Xptxas", "-v"]
SASS_TARGET = {80: "sm_80", 90: "sm_90a"}
COMPILE_TIMEOUT_S = 600


def find_nvcc() -> str | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            path = Path(os.environ[var]) / "bin" / "nvcc"
            if path.is_file():
                return str(path)
    if Path("/usr/local/cuda/bin/nvcc").is_file():
        return "/usr/local/cuda/bin/nvcc"
    return shutil.which("nvcc")


NVCC = find_nvcc()
NO_NVCC = "nvcc not found (set CUDA_HOME or put nvcc on PATH): cannot compile the shipped kernels"

# -- which shipped configs compile ------------------------------------------------------------------------------
# A shipped set is a product: {bf16, fp16} x the four layouts x kernel shapes (tile, warps, stages, schedule, split),
# some shapes in several placements (cluster, raster). Compiling all of it (200 configs; with the cases below 236
# compiles, 7 to 8 minutes of the CPU suite's 13 on 2 cores) repeats the same ptxas work:
# - the 16-bit twins: a bf16 kernel and its fp16 twin differ only in the type of the mma.sync/wgmma instruction
#   (and the names); ptxas's reports of all 100 twin pairs were identical, every entry function's registers, stack
#   and spills (nvcc 13.0). So one of the two compiles, alternating: each layout gets both.
# - placements (cluster shape, raster order and group) change block-index arithmetic and the TMA multicast, not the
#   main loop: each placement compiles once, dealt across the layouts.
# What compiles in every combination is (kernel shape, layout) on each target: the operand paths (ldmatrix or
# ldmatrix.trans, the TMA boxes and shared-memory layouts) meet the shape's accumulators there, and the sm80 kernels
# sit at the register cap (244-255 of 255 at 128x256, a few registers apart between layouts), where a few registers
# more spill (128x256 at BK 64 does: docs/tuning.md). The sm80 family planned for arch 90 ships other tiles than for
# arch 80 (5 of its 6 shapes), so it is a set of its own on sm_90a. The sm90 family's operands reach shared memory
# by TMA and wgmma reads them there, so its layouts differ in a TMA box and a descriptor bit, not in registers: each
# of its shapes compiles in one layout per order of B (representative's by_b_order).

#: The config fields dealt (not compiled in every combination); the others make the kernel's shape.
DEALT_FIELDS = frozenset({"dtype", "out_dtype", "layout", "cluster", "raster", "raster_group"})
TWIN_DTYPES = frozenset({"bf16", "fp16"})


def kernel_shape(cfg: KernelConfig) -> tuple:
    """What a compile of ``cfg`` stands for, but for layout and dtype: the fields not dealt, and the dtype where it
    is not a 16-bit twin (tf32, fp8 and int8 kernels differ in more than an instruction's type)."""
    dtype = "16-bit" if cfg.dtype.value in TWIN_DTYPES else cfg.dtype.value
    out = "same" if cfg.out_dtype == cfg.dtype else cfg.out_dtype.value
    return (dtype, out, *(getattr(cfg, f.name) for f in fields(cfg) if f.name not in DEALT_FIELDS))


def placement(cfg: KernelConfig) -> tuple:
    return cfg.cluster, cfg.raster, cfg.raster_group


def _nearest(group: Sequence[KernelConfig], wanted: tuple) -> KernelConfig:
    """The config of ``group`` with the wanted (placement, layout, dtype); where the set lacks it, the one that matches
    most (placement first, then layout)."""
    def fit(c: KernelConfig) -> tuple[bool, ...]:
        return tuple(x == y for x, y in zip((placement(c), c.layout.tag, c.dtype.value), wanted))
    return max(group, key=fit)


def b_order(cfg: KernelConfig) -> str:
    return cfg.layout.tag[1]   # 't': B row-major (N-major), 'n': column-major (K-major)


def representative(configs: Sequence[KernelConfig], by_b_order: bool = False) -> list[KernelConfig]:
    """The configs to compile for a shipped set: each kernel shape in every layout, its placements dealt across the
    layouts (as many compiles as layouts or placements, whichever more), the 16-bit dtype alternating between layouts
    and between shapes (so that each layout compiles in both). ``by_b_order`` (the sm90 family, whose operands reach
    shared memory by TMA and wgmma reads them there: a layout changes a TMA box and a descriptor bit, not the
    registers, which the accumulators fill): each kernel shape in one layout per order of B, A's order alternating
    between shapes."""
    layouts = sorted({c.layout.tag for c in configs})
    by_b: dict[str, list[str]] = {}
    for tag in layouts:
        by_b.setdefault(tag[1], []).append(tag)
    shapes: dict[tuple, list[KernelConfig]] = {}
    for cfg in configs:
        shapes.setdefault(kernel_shape(cfg), []).append(cfg)
    picked: list[KernelConfig] = []
    for g, group in enumerate(shapes.values()):
        shape_layouts = [tags[g % len(tags)] for tags in by_b.values()] if by_b_order else layouts
        # (by_b_order: A's order alternates with each shape, the dtype with each pair of shapes, so that every layout
        # meets both dtypes)
        turn = g // len(next(iter(by_b.values()))) if by_b_order else g
        placements = sorted({placement(c) for c in group})
        dtypes = sorted({c.dtype.value for c in group})
        for i in range(max(len(placements), len(shape_layouts))):
            best = _nearest(group, (placements[i % len(placements)], shape_layouts[i % len(shape_layouts)],
                                    dtypes[(i + turn) % len(dtypes)]))
            if best not in picked:
                picked.append(best)
    return picked


def one_per_shape(configs: Sequence[KernelConfig]) -> list[KernelConfig]:
    """The configs to compile for a family on its second target (the sm80 family on sm_90a, whose layouts and
    placements the sm_80 cases compile for every kernel shape): each kernel shape once, the layouts and 16-bit dtypes
    dealt across the shapes, then a config of each (layout, dtype) that none of those has."""
    layouts = sorted({c.layout.tag for c in configs})
    dtypes = sorted({c.dtype.value for c in configs})
    shapes: dict[tuple, list[KernelConfig]] = {}
    for cfg in configs:
        shapes.setdefault(kernel_shape(cfg), []).append(cfg)
    picked = [max(group, key=lambda c, g=g: (c.layout.tag == layouts[g % len(layouts)],
                                              c.dtype.value == dtypes[g % len(dtypes)]))
              for g, group in enumerate(shapes.values())]
    seen = {(c.layout.tag, c.dtype.value) for c in picked}
    for cfg in configs:
        if (cfg.layout.tag, cfg.dtype.value) not in seen:
            seen.add((cfg.layout.tag, cfg.dtype.value))
            picked.append(cfg)
    return picked


# (target arch, config): the architecture's default family, plus the sm80 family where another is the default.
CASES = [(arch, cfg) for arch in SHIPPED_ARCHS
         for cfg in representative(shipped_configs(arch), by_b_order=shipped_configs(arch)[0].family == "sm90")]
CASES += [(arch, cfg) for arch in SHIPPED_ARCHS if shipped_configs(arch)[0].family != "sm80"
          for cfg in one_per_shape(shipped_configs(arch, family="sm80"))]
# Tiles the templates build but the planner never picks, each with a K-major and an N-major B: the wide
# 128x320 tile (two wgmmas per k step, accumulators beyond 128 per thread).
CASES += [(90, Gemm(dtype, layout, arch=90, schedule="cooperative", tile_shape=(128, 320, 64),
                    cluster_shape=(2, 1)).config) for dtype, layout in (("bf16", "tn"), ("fp16", "nn"))]
# A 64-row cooperative tile split along N between its consumers, K-major and N-major B; N tiles that are no multiple
# of 64 (16-bit, K-major B only), cooperative and pingpong, the pingpong one with a column-major 16-bit D (staged
# transposed, stored by TMA: a swapped dX's kernel, planner.backward.swaps_operands).
CASES += [(90, Gemm(dtype, layout, arch=90, schedule=schedule, tile_shape=tile, cluster_shape=cluster,
                    layout_c=layout_c).config)
          for dtype, layout, schedule, tile, cluster, layout_c in (
              ("bf16", "tn", "cooperative", (64, 128, 64), (2, 1), "row"),
              ("fp16", "tt", "cooperative", (64, 256, 64), (1, 1), "row"),
              ("bf16", "tn", "cooperative", (128, 144, 64), (2, 1), "row"),
              ("fp16", "nn", "pingpong", (128, 80, 64), (1, 1), "col"))]
# The epilogue staged in the ring (KernelConfig.staging_in_ring): an odd-width pingpong tile as rule 18 plans it, and a
# cooperative 2x1 one (the consumers' barrier before the held slot); the 192-row cooperative tile split along N.
CASES += [(90, Gemm("bf16", "tn", arch=90, schedule="pingpong", tile_shape=(128, 96, 64), cluster_shape=(1, 1)).config),
          (90, replace(Gemm("fp16", "nt", arch=90, schedule="cooperative", tile_shape=(128, 256, 64),
                            cluster_shape=(2, 1)).config, staging_in_ring=True)),
          (90, Gemm("bf16", "tn", arch=90, schedule="cooperative", tile_shape=(192, 128, 64),
                    cluster_shape=(1, 1)).config)]


COL_MAJOR_FP32 = ep.Matrix(dtype="fp32", order="col")


def _fused(acc, bias: ep.Col, scale: ep.Row, R: COL_MAJOR_FP32, alpha: ep.Scalar):
    h = alpha * acc * scale + bias
    return ep.clamp(ep.silu(h), -4.0, 4.0) + R, h


# Fused epilogues, in both families: the activations and every operand kind (a per-row and a per-column
# vector, an M x N operand of another dtype and order, a scalar, a second output).
# Per-tensor scales (ScalarTensor operands: one element read on the device with the per-row values) as well.
EPILOGUES = ({"activation": "gelu_tanh", "bias": "col"}, {"activation": "silu", "bias": "row", "out_dtype": "fp32"},
             {"alpha": 2.0, "beta": 0.5}, {"epilogue": _fused},
             {"epilogue": with_scales(ep.from_knobs(activation="gelu", bias="col"), "tensor")})
CASES += [(arch, Gemm("bf16", "tn", arch=arch, **knobs).config) for arch in SHIPPED_ARCHS for knobs in EPILOGUES]
# fp8 (the kernels' own main loops): fast accumulation on the 128-row pingpong tile (two m64 blocks per warpgroup, the
# grouped walk's trimmed path beside the dense one), promoted per tensor and block-scaled (unrolled) cooperative tiles,
# and the block-scaled 128-row pingpong tile (promoted in slices).
CASES += [(90, Gemm("e4m3", "tn", arch=90, out_dtype="bf16", **knobs).config) for knobs in
          ({"scale": "tensor", "fast_accum": True, "schedule": "pingpong", "tile_shape": (128, 128, 128),
            "cluster_shape": (2, 1)},
           {"scale": "tensor", "schedule": "cooperative", "tile_shape": (128, 128, 128), "cluster_shape": (2, 1)},
           {"scale": "block", "schedule": "cooperative", "tile_shape": (128, 192, 128), "cluster_shape": (2, 1)},
           {"scale": "block", "schedule": "pingpong", "tile_shape": (128, 128, 128), "cluster_shape": (1, 1)})]
# tf32 (fp32 tensors, A and B K-major): cooperative, pingpong, and a fused epilogue writing bf16.
CASES += [(90, Gemm("fp32", "tn", arch=90, **knobs).config) for knobs in
          ({}, {"schedule": "pingpong", "tile_shape": (128, 128, 32)},
           {"activation": "gelu", "bias": "col", "out_dtype": "bf16"})]
# tf32 tiles that are M/N-major: a column-major A read into registers by the consumers, a row-major B transposed in
# shared memory by the producer warpgroup (72 registers there, 216 for the consumers); a row-major B with a fused
# epilogue writing bf16, both with one on the few-row kernel, and both with a fused epilogue writing bf16 (the fewest
# registers the register path's main loop leaves an epilogue).
CASES += [(90, Gemm("fp32", layout, arch=90, **knobs).config) for layout, knobs in
          (("nn", {}), ("tt", {"activation": "gelu", "bias": "col", "out_dtype": "bf16"}),
           ("nt", {"m": 64, "n": 4096, "k": 4096}), ("nt", {"activation": "gelu", "bias": "col", "out_dtype": "bf16"}))]
# fp8 (A and B K-major): promoted per tensor, fast accumulation, per-block scales at the tiles promotion allows
# (128x256 in two column slices: 128 + 64 accumulators; 128x192 whole: 96 + 96; 256x128: two m64 blocks in slices),
# rowwise on pingpong; a 64-row cooperative tile split along N, each warpgroup promoting its half of the columns.
CASES += [(90, Gemm("e4m3", "tn", arch=90, **knobs).config) for knobs in
          ({"scale": "tensor"}, {"scale": "tensor", "fast_accum": True}, {"scale": "block"},
           {"scale": "block", "tile_shape": (128, 192, 128), "cluster_shape": (1, 2)},
           {"scale": "block", "tile_shape": (256, 128, 128)},
           {"scale": "block", "tile_shape": (64, 256, 128), "schedule": "cooperative"},
           {"scale": "row", "schedule": "pingpong", "tile_shape": (64, 128, 128), "out_dtype": "fp16"})]
# The interleaved-K 64-row tiles the planner takes at one wave (rule 22): block-scaled 64x96 in a 2x1 cluster (the
# unrolled block-scaled loop stepping two k tiles) and per tensor 64x64 with an fp32 D.
CASES += [(90, Gemm("e4m3", "tn", arch=90, m=256, n=3072, k=8192, scale="block").config),
          (90, Gemm("e4m3", "tn", arch=90, m=128, n=4096, k=4096, scale="tensor", out_dtype="fp32").config)]
CASES += [(90, Gemm("e5m2", "tn", arch=90, scale="row", out_dtype="fp32").config),
          (90, Gemm("e5m2", "tn", arch=90, dtype_b="e4m3", scale="row").config)]
# int8 (int32 accumulators): exact int32 out, and rowwise scales with an activation writing bf16; pingpong with a
# column-major D (direct stores of the int32 bits).
CASES += [(90, Gemm("int8", "tn", arch=90, **knobs).config) for knobs in
          ({}, {"scale": "row", "out_dtype": "bf16", "activation": "silu"},
           {"schedule": "pingpong", "tile_shape": (128, 128, 128), "layout_c": "col"})]
# int8 on the sm80 family (mma.sync m16n8k32): int32 out through the staged stores, and rowwise scales to bf16.
CASES += [(80, Gemm("int8", "tn", arch=80, **knobs).config) for knobs in
          ({}, {"scale": "row", "out_dtype": "bf16", "activation": "gelu"})]
# tf32 on the sm80 family: K-major A and B (ldmatrix, cvt.rna on sm_80) and M/N-major ones (32-bit shared loads,
# cvt.rn on sm_90a).
CASES += [(80, Gemm("fp32", "tn", arch=80).config), (90, Gemm("fp32", "nt", arch=90, family="sm80").config)]
# Stream-K (KernelConfig.stream_k; the planner's pingpong split-K compiles among the shipped configs): the planner's
# 16-bit kernel, and a small-M fp8 block-scaled one whose units are all cut (promotion and partial tiles together).
CASES += [(90, replace(Gemm("bf16", "tn", arch=90).config, stream_k=True)),
          (90, replace(Gemm("e4m3", "tn", arch=90, scale="block", schedule="cooperative", cluster_shape=(1, 1),
                            m=128, n=4096, k=4096).config, stream_k=True))]


def _silu_times_up(acc, up: ep.Matrix):
    return ep.silu(acc) * up


# A quantized D (fp8 with 1x128 block scales, the epilogue's quantize_block): after a fused epilogue with 128 + the
# quantization's registers at 128x256, on a pingpong 64x128 tile, and out of an fp8 block-scaled main loop, alone and
# with the fp8 MLP gate's M x N operand read element by element (straight-line parts: 40 bytes of spills before them);
# fp8 N tiles that are no multiple of 64 (block scales split at 32-column steps).
CASES += [(90, Gemm(dtype, "tn", arch=90, **knobs).config) for dtype, knobs in (
    ("bf16", {"out_dtype": "e4m3", "activation": "silu", "bias": "col"}),
    ("bf16", {"out_dtype": "e5m2", "schedule": "pingpong", "tile_shape": (64, 128, 64)}),
    ("e4m3", {"out_dtype": "e4m3", "scale": "block"}),
    ("e4m3", {"out_dtype": "e4m3", "scale": "block", "epilogue": _silu_times_up}),
    ("e4m3", {"scale": "block", "tile_shape": (128, 160, 128), "cluster_shape": (2, 1)}))]
# A case listed twice (a knob case that a shipped config already is) compiles once.
CASES = list({(arch, cfg.name): (arch, cfg) for arch, cfg in CASES}.values())
# Cases built with a template switch (defined at the top of the source, as GEMMGEN_EXTRA_NVCC_FLAGS would), each with
# a constant expression of the source's `Kernel` that holds only where the switch took effect (a static_assert at its
# end): tf32's M-major A transposed in shared memory as the row-major B is, rather than read into registers (the
# path the switch keeps for comparison, docs/dtypes.md); tf32 tt built as the transposed product D^T = B^T A^T (its A
# read into registers, nothing transposed) beside the plain kernel that transposes B, on the planner's cooperative tile
# and on the few-row one: the default, its switch spelled out so that the assertion may name SwappedKernel.
SWITCHED_CASES = [(90, Gemm("fp32", "nt", arch=90, activation="gelu", bias="col", out_dtype="bf16").config,
                   "GEMMGEN_SM90_TF32_A_REGISTERS=0", "Kernel::kTransposeA && Kernel::kTransposeB")]
SWITCHED_CASES += [(90, Gemm("fp32", "tt", arch=90, **hints).config, "GEMMGEN_SM90_TF32_TT_SWAPPED=1",
                    "SwappedKernel::kARegisters && !SwappedKernel::kTransposes && Kernel::kTransposeB")
                   for hints in ({}, {"m": 64, "n": 4096, "k": 4096})]


def switched_case(cfg: KernelConfig, define: str) -> str:
    """A switched case's key beside the plain cases' names."""
    return f"{cfg.name}+{define}"

#: At most this many shipped configs per (arch, family): each is planned and rendered here, and a new kernel shape
#: among them is one nvcc run per layout in CI (about 1-5 s on one core). sm90 ships 120 since the planner's 64-row
#: tiles for few rows, split-K and the 128x192 candidate.
MAX_SHIPPED = {"sm80": 64, "sm90": 128}


def run_host_program(source: str, folder: Path) -> str:
    """Compile ``source`` (CUDA C++ including templates/ headers) with nvcc into a host program, run it,
    and return its output; fails the calling test if either step fails. For checks of the templates'
    host-callable logic (test_sm80_swizzle.py, test_sm90_stream_k.py)."""
    cu, exe = folder / "check.cu", folder / "check"
    cu.write_text(source)
    build = subprocess.run([NVCC, "-std=c++17", "-I", str(templates_dir()), "-o", str(exe), str(cu)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


# -- the ptxas report ------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")


def parse_ptxas(log: str) -> dict[str, dict[str, object]]:
    """{entry function: {target, stack, spill_stores, spill_loads, registers}}. An entry whose stack/spill
    line is missing keeps None there, so a report that changes format fails the test instead of passing."""
    report: dict[str, dict[str, object]] = {}
    entry = properties_of = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry, properties_of = m.group(1), None
            report[entry] = {"target": m.group(2), "stack": None, "spill_stores": None, "spill_loads": None,
                             "registers": None}
        elif m := _PROPERTIES.search(line):
            properties_of = m.group(1)
        elif (m := _FRAME.search(line)) and entry is not None and properties_of == entry:
            report[entry].update(zip(("stack", "spill_stores", "spill_loads"), map(int, m.groups())))
        elif (m := _REGISTERS.search(line)) and entry is not None:
            report[entry]["registers"] = int(m.group(1))
    return report


def test_parse_ptxas() -> None:
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_unaligned' for 'sm_90a'
ptxas info    : Function properties for k_unaligned
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 8320 bytes smem
ptxas info    : Function properties for helper
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
"""
    assert parse_ptxas(log) == {
        "k_unaligned": {"target": "sm_90a", "stack": 0, "spill_stores": 0, "spill_loads": 0, "registers": 64},
        "k": {"target": "sm_90a", "stack": 8, "spill_stores": 12, "spill_loads": 4, "registers": 255},
    }


# -- compiling, all at once ---------------------------------------------------------------------------


#: Tries at starting one nvcc process (_compile).
SPAWN_ATTEMPTS = 3


@dataclass(frozen=True)
class Compiled:
    source: Path
    command: list[str]
    returncode: int
    output: str
    seconds: float


def _compile(name: str, text: str, arch: int, folder: Path,
             run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Compiled:
    """``run`` starts nvcc; a test hands in its own rather than patch ``subprocess.run``, which the background
    compiles (BackgroundCompiles) call from their threads at the same time."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / name
    source.write_text(text)
    cmd = [NVCC, *DEVICE_FLAGS, *ARCHS[arch].gencode.split(), f"-I{templates_dir()}", "-cubin",
           "-o", str(source.with_suffix(".cubin")), str(source)]
    start = time.perf_counter()
    for attempt in range(SPAWN_ATTEMPTS):
        try:
            proc = run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            rc, out = proc.returncode, proc.stdout + proc.stderr
            break
        except subprocess.TimeoutExpired as err:
            rc, out = -1, f"timed out after {COMPILE_TIMEOUT_S} s\n{err.stdout or ''}{err.stderr or ''}"
            break
        except OSError as err:
            # Starting nvcc from a background thread while the suite's own thread runs torch has failed with EFAULT
            # ("Bad address") now and then: the spawn, not the compile. Started again, it runs.
            rc, out = -1, f"nvcc did not start ({SPAWN_ATTEMPTS} attempts): {err}"
            time.sleep(0.2 * (attempt + 1))
    return Compiled(source, cmd, rc, out, time.perf_counter() - start)


class BackgroundCompiles:
    """Every case's kernel for its arch, compiled by nvcc processes: one unique source per target (a source rendered
    twice for one target compiles once), the longest first (the fused epilogues: the slowest compiles), so that no
    long compile is left running alone at the end.

    The suite's Python tests run on one core, so the compiles start in the background when the session's tests are
    collected (tests/conftest.py ``pytest_collection_modifyitems``, which also runs this module's tests last), on the
    cores but one; ``results`` then compiles what is left on every core and waits. On the CI's 2 cores this takes
    the fixture's 185-200 s of compiles (one worker per core) off the suite's wall time, but for what overlaps with
    the suite's own multi-process work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[tuple[tuple, tuple[int, str, str]]] = []
        self._done: dict[tuple, Compiled] = {}
        self._source_of: dict[tuple[int, str], tuple] = {}
        self._threads: list[threading.Thread] = []
        self._root: Path | None = None
        self._start = 0.0

    def start(self, root: Path, workers: int) -> None:
        """Render every case and start ``workers`` background threads (idempotent)."""
        with self._lock:
            if self._root is not None:
                return
            self._root, self._start = root, time.perf_counter()
            unique: dict[tuple, tuple[int, str, str]] = {}
            for arch, cfg, define, took_effect in [(arch, cfg, None, None) for arch, cfg in CASES] + SWITCHED_CASES:
                (name, text), = render(cfg).items()
                if define is not None:
                    macro, value = define.split("=")
                    text = (f"#define {macro} {value}\n{text}"
                            f'\nstatic_assert({took_effect}, "{define} took effect");\n')
                case = (arch, cfg.name if define is None else switched_case(cfg, define))
                self._source_of[case] = key = (arch, hashlib.sha256(text.encode()).hexdigest())
                unique.setdefault(key, (arch, name, text))
            # popped from the end: the longest sources last in the list
            self._queue = sorted(unique.items(), key=lambda item: len(item[1][2]))
        self._add_threads(workers)

    def _add_threads(self, count: int) -> None:
        for _ in range(count):
            thread = threading.Thread(target=self._work, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                key, (arch, name, text) = self._queue.pop()
            try:
                compiled = _compile(name, text, arch, self._root / f"sm{arch}")
            except Exception as err:  # (recorded as a failed compile: the cases that need it fail, naming it)
                compiled = Compiled(self._root / f"sm{arch}" / name, [], -1, f"{type(err).__name__}: {err}", 0.0)
            with self._lock:
                self._done[key] = compiled

    def results(self, root: Path, workers: int) -> dict[tuple[int, str], Compiled]:
        """Each case's compile: started here if collection did not start it, the rest compiled on ``workers``
        threads in all."""
        self.start(root, 0)
        self._add_threads(max(0, workers - sum(t.is_alive() for t in self._threads)))
        for thread in self._threads:
            thread.join()
        print(f"\n[nvcc] {len(self._done)} kernels compiled, the last {time.perf_counter() - self._start:.1f} s after "
              "the first started")
        return {case: self._done[key] for case, key in self._source_of.items()}


BACKGROUND = BackgroundCompiles()


def compile_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def start_background_compiles(root: Path) -> None:
    """Called by tests/conftest.py when this module's tests are selected: the compiles start on the cores but one."""
    if NVCC is not None:
        BACKGROUND.start(root, max(1, compile_workers() - 1))


@pytest.fixture(scope="session")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, str], Compiled]:
    """Every case's kernel for its arch (BackgroundCompiles), on every core from here on."""
    if NVCC is None:
        pytest.skip(NO_NVCC)
    return BACKGROUND.results(tmp_path_factory.mktemp("nvcc"), compile_workers())


def test_a_compile_whose_spawn_fails_once_runs_again(tmp_path) -> None:
    """nvcc's spawn from a background thread failed with EFAULT now and then (_compile): tried again, not lost."""
    calls = []

    def flaky_run(cmd, **kwargs):
        calls.append(cmd)
        if len(calls) == 1:
            raise OSError(14, "Bad address", cmd[0])
        return subprocess.CompletedProcess(cmd, 0, "ok", "")

    compiled = _compile("k.cu", "// empty", 90, tmp_path, run=flaky_run)
    assert (compiled.returncode, compiled.output, len(calls)) == (0, "ok", 2)


def test_shipped_configs_are_few_enough_for_ci() -> None:
    """Each shipped config is one nvcc run here; a planner change that multiplies them should be seen."""
    for arch in SHIPPED_ARCHS:
        for family in (None, "sm80"):
            configs = shipped_configs(arch, family=family)
            family = family or configs[0].family
            assert 1 <= len(configs) <= MAX_SHIPPED[family], f"sm{arch} {family}: {len(configs)} shipped configs"
            assert [c.name for c in configs] == sorted({c.name for c in configs})
            assert all(c.arch == arch and c.family == family for c in configs)
    assert {c.family for c in shipped_configs(90)} == {"sm90"}
    assert {c.family for c in shipped_configs(80)} == {"sm80"}


def test_the_compiled_kernels_cover_the_shipped_ones() -> None:
    """Of each shipped set, what compiles (representative()): every kernel shape in every placement and in every
    layout (sm90: in each order of B), every layout in every 16-bit dtype; of the sm80 family on sm_90a
    (one_per_shape) every kernel shape and every layout in every 16-bit dtype. A planner change that ships a new shape, placement, layout or dtype is
    compiled by the cases above, or fails here."""
    def uncovered(chosen: Sequence[KernelConfig], shipped: Sequence[KernelConfig],
                  of: Callable[[KernelConfig], Hashable]) -> list[str]:
        """The shipped configs that no compiled one stands for (by ``of``)."""
        seen = {of(c) for c in chosen}
        return [c.name for c in shipped if of(c) not in seen]

    for arch in SHIPPED_ARCHS:
        default = shipped_configs(arch)[0].family
        for family in sorted({default, "sm80"}):
            shipped = shipped_configs(arch, family=family)
            chosen = [cfg for a, cfg in CASES if a == arch and cfg in shipped]
            every = [lambda c: kernel_shape(c), lambda c: (c.layout.tag, c.dtype.value)]
            if family == default:   # (a family on its second target: one_per_shape)
                every += [lambda c: (kernel_shape(c), placement(c)), lambda c: (kernel_shape(c), b_order(c))]
            if family == default == "sm80":   # (sm90: representative's by_b_order)
                every += [lambda c: (kernel_shape(c), c.layout.tag)]
            for of in every:
                missing = uncovered(chosen, shipped, of)
                assert not missing, f"sm{arch} {family} on {SASS_TARGET[arch]}: nothing compiled stands for {missing}"


def test_representative_deals_a_product() -> None:
    """The dealing on a made-up set: 2 dtypes x 4 layouts x (a shape in 3 placements, a shape in 1)."""
    coop = Gemm("bf16", "tn", arch=90, schedule="cooperative", tile_shape=(128, 256, 64), cluster_shape=(1, 1)).config
    pp = replace(coop, tile=(128, 128, 64), schedule="pingpong")
    shipped = shipped_configs(90)
    dtypes = sorted({c.dtype for c in shipped}, key=lambda d: d.value)
    layouts = sorted({c.layout for c in shipped}, key=lambda lay: lay.tag)
    assert len(dtypes) == 2 and len(layouts) == 4
    configs = [replace(cfg, dtype=d, out_dtype=d, layout=lay, cluster=cl)
               for cfg, clusters in ((coop, ((1, 1), (2, 1), (1, 2))), (pp, ((1, 1),)))
               for cl in clusters for lay in layouts for d in dtypes]
    picked = representative(configs)
    assert len(picked) == 8 and len(set(picked)) == 8
    assert {(c.tile, c.layout) for c in picked} == {(c.tile, c.layout) for c in configs}
    assert {c.cluster for c in picked if c.tile == coop.tile} == {(1, 1), (2, 1), (1, 2)}
    for layout in layouts:
        assert {c.dtype for c in picked if c.layout == layout} == set(dtypes)
    # a placement more than there are layouts: all of them still compile, a layout twice
    wide = configs + [replace(c, cluster=(2, 2)) for c in configs if c.tile == coop.tile and c.cluster == (1, 1)]
    assert {c.cluster for c in representative(wide) if c.tile == coop.tile} == {(1, 1), (2, 1), (1, 2), (2, 2)}


def test_sm90_kernels_compile_for_sm90a_only() -> None:
    assert {(arch, cfg.family) for arch, cfg in CASES} == {(80, "sm80"), (90, "sm80"), (90, "sm90")}


@pytest.mark.parametrize("arch, cfg", CASES, ids=[f"sm{arch}-{cfg.name}" for arch, cfg in CASES])
def test_compiles_without_spills(compiled: dict[tuple[int, str], Compiled], arch: int, cfg: KernelConfig) -> None:
    check_compiled(compiled[(arch, cfg.name)], arch, cfg)


@pytest.mark.parametrize("arch, cfg, define, took_effect", SWITCHED_CASES,
                         ids=[f"sm{arch}-{switched_case(cfg, d)}" for arch, cfg, d, _ in SWITCHED_CASES])
def test_switched_kernels_compile_without_spills(compiled: dict[tuple[int, str], Compiled], arch: int,
                                                 cfg: KernelConfig, define: str, took_effect: str) -> None:
    check_compiled(compiled[(arch, switched_case(cfg, define))], arch, cfg)


def check_compiled(result: Compiled, arch: int, cfg: KernelConfig) -> None:
    """nvcc compiled the kernel and its unaligned twin for the arch's SASS target, with no stack and no spills."""
    assert result.returncode == 0, (
        f"nvcc failed on {result.source}:\n  {' '.join(result.command)}\n{result.output}")
    report = parse_ptxas(result.output)
    assert cfg.name in report, f"ptxas reported no entry function {cfg.name}:\n{result.output}"
    assert f"{cfg.name}_unaligned" in report, result.output
    problems = []
    for entry, info in report.items():
        if info["target"] != SASS_TARGET[arch]:
            problems.append(f"{entry}: compiled for {info['target']}, expected {SASS_TARGET[arch]}")
        for key in ("stack", "spill_stores", "spill_loads"):
            if info[key] != 0:
                problems.append(f"{entry}: {info[key]} bytes {key.replace('_', ' ')}")
    # ptxas serializes every wgmma of a function where it cannot prove the accumulators untouched between a wgmma and
    # its wait (C7510-C7520, "Potential Performance Loss"): correct, and 0.6x as fast (the fp8 128x128 pingpong tile).
    problems += [line for line in result.output.splitlines() if "wgmma.mma_async instructions are serialized" in line]
    # An unroll pragma that no longer precedes its loop is dropped with a warning only (the block-scaled fp8 loop lost its
    # unroll by three this way, a quarter of its wgmmas in the SASS).
    problems += [line for line in result.output.splitlines() if "pragma must immediately precede" in line]
    assert not problems, (f"{result.source} for {SASS_TARGET[arch]}:\n  " + "\n  ".join(problems)
                          + f"\nptxas report:\n{result.output}")
