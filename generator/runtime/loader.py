"""Build (or find in the build cache) and load the kernel libraries of configs, with the JIT runtime joining
the first parallel ninja run."""
from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

import torch

from ..toolchain import BuildError, BuildRequest, build_many
from ..render import render, templates_dir
from ..spec.arch import ARCHS
from ..spec.config import KernelConfig
from . import jit_runtime
from .library import KernelLibrary


def build_target(config: KernelConfig) -> int:
    """The architecture to compile for: the visible GPU when there is one, else the plan's."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        cc = major * 10 + minor
        if cc < config.arch:
            raise RuntimeError(f"{config.name} was planned for sm_{config.arch} but this GPU is sm_{cc}: "
                               f"plan with arch={cc} (or arch=None)")
        if cc in ARCHS:
            return cc
    return config.arch


#: nvcc flags added to every kernel library this process builds, e.g. "-DGEMMGEN_SMALL_M_N_MAJOR=0": a template's
#: experiment switch for a whole benchmark run (docs/contributing.md). They are part of the build cache key.
EXTRA_FLAGS_ENV = "GEMMGEN_EXTRA_NVCC_FLAGS"


def extra_nvcc_flags() -> tuple[str, ...]:
    """The flags of EXTRA_FLAGS_ENV (shell words), none when it is unset."""
    return tuple(shlex.split(os.environ.get(EXTRA_FLAGS_ENV, "")))


def build_request(config: KernelConfig, target: int | None = None,
                  extra_flags: Sequence[str] = ()) -> BuildRequest:
    """``config``'s build: its rendered sources for its target, nvcc given EXTRA_FLAGS_ENV's flags and then
    ``extra_flags`` (a template's switches for an A/B build beside the plain one; part of the cache key)."""
    target = build_target(config) if target is None else target
    return BuildRequest(name=config.name, sources=render(config), gencode=ARCHS[target].gencode,
                        include_dirs=(str(templates_dir()),), extra_flags=extra_nvcc_flags() + tuple(extra_flags))


def build_libraries(configs: list[KernelConfig], *, verbose: bool,
                    extra_flags: Sequence[str] = ()) -> list[KernelLibrary]:
    """Build the kernel libraries of ``configs`` (or find them in the build cache) and load them, nvcc given
    ``extra_flags`` too (build_request); the JIT runtime, while it is not loaded, joins the same parallel ninja run (so
    it costs no extra time in the first build ever). A runtime that fails to build costs a warning, never the
    kernels."""
    requests = [build_request(c, extra_flags=extra_flags) for c in configs]
    with_runtime = jit_runtime.RUNTIME.wanted()
    try:
        results = build_many(requests + [jit_runtime.runtime_request()] if with_runtime else requests, verbose=verbose)
    except BuildError as exc:
        if not with_runtime:
            raise
        results = build_many(requests, verbose=verbose)  # the kernels' own errors, if they have any
        jit_runtime.RUNTIME.fail(str(exc))
    else:
        if with_runtime:
            jit_runtime.RUNTIME.load(results[-1].library)
    return [KernelLibrary.load(r.library, c.name) for c, r in zip(configs, results)]


def load_library(config: KernelConfig, *, verbose: bool = False) -> KernelLibrary:
    """Build ``config``'s kernel library (or find it in the build cache) and load it."""
    return build_libraries([config], verbose=verbose)[0]
