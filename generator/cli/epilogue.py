"""``--epilogue module:function``: import the function (from a module or a .py file) and trace it into an
Epilogue, refusing it next to the epilogue knobs; every failure is a one-line ValueError (exit 2)."""
from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

from ..spec.epilogue import KNOB_NAMES, Epilogue, trace


def _one_line(err: BaseException) -> str:
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


def _import_epilogue_target(target: str, spec: str) -> object:
    """The module of --epilogue's left part: a .py file (loaded from its path) or an importable module
    (the current folder first on the path, as for python -m)."""
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    if is_file:
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"--epilogue {spec!r}: no such file {target!r}")
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
        name = f"_gemmgen_epilogue_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
        extra_path, what = str(path.resolve().parent), f"the file {target!r}"
    else:
        name, extra_path, what = target, os.getcwd(), f"the module {target!r}"
    added = extra_path not in sys.path
    if added:
        sys.path.insert(0, extra_path)
    try:
        if not is_file:
            return importlib.import_module(target)
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ImportError(f"cannot load {target!r} as a Python module")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module  # string annotations and dataclasses look their module up here
        try:
            loader_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    except Exception as err:
        raise ValueError(f"--epilogue {spec!r}: cannot import {what}: {type(err).__name__}: "
                         f"{_one_line(err)}") from None
    finally:
        if added and extra_path in sys.path:
            sys.path.remove(extra_path)


def _load_epilogue(spec: str) -> Epilogue:
    """--epilogue module:function / path/to/file.py:function: import it and trace the function.
    Raises ValueError (the CLI exits 2) with a one-line message for every way this can fail."""
    target, _, attr = spec.rpartition(":")
    fn: object = _import_epilogue_target(target, spec)
    for part in attr.split("."):
        if not hasattr(fn, part):
            functions = sorted(k for k, v in getattr(fn, "__dict__", {}).items()
                               if callable(v) and not k.startswith("_")
                               and getattr(v, "__module__", None) == getattr(fn, "__name__", None))
            listed = f" (its functions: {', '.join(functions)})" if functions else ""
            raise ValueError(f"--epilogue {spec!r}: {target!r} has no attribute {attr!r}{listed}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ValueError(f"--epilogue {spec!r}: {attr} is not a function of the accumulator (its type is "
                         f"{type(fn).__name__})")
    try:
        return trace(fn)
    except Exception as err:  # EpilogueError (a ValueError) says why and how to fix it; anything else is a bug in fn
        kind = "" if isinstance(err, ValueError) else f"{type(err).__name__}: "
        raise ValueError(f"--epilogue {spec!r}: {kind}{_one_line(err)}") from None


def _resolve_epilogue(args: argparse.Namespace) -> None:
    """Refuse --epilogue with the knobs, then replace args.epilogue (module:function) by its Epilogue."""
    if args.epilogue is None:
        return
    knobs = [f"--{k}" for k in KNOB_NAMES if getattr(args, k) is not None]
    if knobs:
        raise ValueError(f"--epilogue cannot be combined with {', '.join(knobs)}: use one or the other (put the "
                         "activation, bias and scales into the function, or drop --epilogue and use the knobs)")
    args.epilogue = _load_epilogue(args.epilogue)

