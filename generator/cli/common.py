"""What the commands share: the Gemm keyword arguments and the plan that the knob options give, the hint when
no GPU is there to plan for, and the error exit."""
from __future__ import annotations

import argparse
import sys


def _error(message: str, status: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def _plan_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """The Gemm keyword arguments that the knob options give."""
    return dict(dtype=args.dtype, layout=args.layout, arch=args.arch, out_dtype=args.out_dtype,
                layout_a=args.layout_a, layout_b=args.layout_b, layout_c=args.layout_c,
                m=args.m, n=args.n, k=args.k, family=args.family, tile_shape=args.tile, warps=args.warps,
                stages=args.stages, raster_group=args.raster_group, schedule=args.schedule,
                cluster_shape=args.cluster, raster=args.raster, activation=args.activation, bias=args.bias,
                alpha=args.alpha, beta=args.beta, epilogue=args.epilogue, scale=args.scale,
                fast_accum=args.fast_accum, amax=args.amax, dtype_b=args.dtype_b, interleave_k=args.interleave_k)


def _no_gpu_hint(err: RuntimeError) -> RuntimeError:
    """arch=None could not detect the GPU: say how to do without one on the command line."""
    choices = " or ".join(f"--arch {a}" for a in (80, 90))
    return RuntimeError(f"{err} (on the command line: {choices})")


def _make_plan(args: argparse.Namespace):
    from ..gemm import Gemm

    try:
        return Gemm(**_plan_kwargs(args))
    except RuntimeError as err:
        if args.arch is None:
            raise _no_gpu_hint(err) from None
        raise

