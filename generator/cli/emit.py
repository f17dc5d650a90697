"""``emit``: one or several plans (the knob options, ``--plan``, ``--plans FILE``) into a pip-installable
package, and what it says about the ops it wrote."""
from __future__ import annotations

import argparse

from ..spec.epilogue import KNOB_NAMES
from .common import _make_plan, _no_gpu_hint, _plan_kwargs


def _check_plan_options(entries: list[dict[str, object]], args: argparse.Namespace) -> None:
    """A --plan's epilogue knobs (activation=, ...) cannot be combined with --epilogue, as the options cannot."""
    for j, entry in enumerate(entries):
        knobs = [f"{k}=" for k in KNOB_NAMES if k in entry]
        if knobs and args.epilogue is not None:
            raise ValueError(f"--plan {j}: {', '.join(knobs)} cannot be combined with --epilogue: use one or the "
                             "other")


def cmd_emit(args: argparse.Namespace) -> int:
    from ..emit import backward_ops, default_package_name, emit, resolve_ops
    from ..plans import load_plans_file, plans_file_autograd, plans_from_entries

    defaults = {k: v for k, v in _plan_kwargs(args).items() if v is not None}
    plans, op_names = [], []
    try:
        if args.plans is not None:
            plans, op_names = load_plans_file(args.plans, defaults)
        if args.plan:
            _check_plan_options(args.plan, args)
            more, more_names = plans_from_entries(args.plan, defaults, where="--plan")
            plans, op_names = plans + more, op_names + more_names
        if not plans:
            plans, op_names = [_make_plan(args)], [None]
    except RuntimeError as err:
        raise _no_gpu_hint(err) from None
    if args.op_name is not None:
        if len(args.op_name) != len(plans):
            raise ValueError(f"--op-name is given {len(args.op_name)} time(s) for {len(plans)} plan(s): "
                             "give one per plan, in order, or none")
        op_names = args.op_name
    name = args.name if args.name is not None else default_package_name(args.out)
    ops = resolve_ops(plans, op_names)
    autograd = args.autograd
    if autograd is None:   # no --no-autograd: what the plans file says (emit's plans.json does), else True
        autograd = plans_file_autograd(args.plans) if args.plans is not None else None
        autograd = True if autograd is None else autograd
    out = emit(plans, name=name, out=args.out, op_names=op_names, autograd=autograd, tuning=args.tuning)
    print(f"{out}: package {name}, {len(ops)} op(s):")
    for op in ops:
        epilogue = op.config.epilogue
        fused = "" if epilogue.is_identity else f", D = {epilogue.text}"
        inputs = op.config.dtype_tag.replace("x", " x ")
        print(f"  {name}.{op.name}  ({inputs} -> {op.config.out_dtype.value}, layout "
              f"{op.config.layout.tag}{fused}, kernel {op.config.name}, sm_{op.config.arch})")
    forward_only = [op.name for op in ops if not op.differentiable]
    if not autograd:
        why = "--no-autograd" if args.autograd is False else 'the plans file says "autograd": false'
        print(f"autograd: none ({why}): the ops are not differentiable")
    else:
        if len(forward_only) < len(ops):
            print(f"autograd: differentiable, with {len(backward_ops(ops))} backward kernel(s) in the package "
                  "(--no-autograd leaves them out)")
        if forward_only:
            print("autograd: forward only (fp8 and int8 inputs, and quantized outputs, refuse inputs that require "
                  f"grad): {', '.join(forward_only)}")
    print(f"install: pip install --no-build-isolation {out}")
    return 0

