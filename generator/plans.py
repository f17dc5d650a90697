"""Plans files: the JSON that ``emit`` writes beside a package (plans.json) and the CLI's ``--plans``, read
back into Gemm plans. Above ``gemm`` in the imports: it builds plans from their keyword arguments."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from .gemm import Gemm
from .spec.epilogue import epilogue_from_json

# -- plans files (the CLI's --plans, and the plans.json that emit writes) ------------------------------

#: Keys a plan entry may have: Gemm keyword arguments (the epilogue knobs activation, bias, alpha, beta among them;
#: ``epilogue``: a function epilogue's structure, as ``generator.spec.epilogue.epilogue_to_json`` writes it), plus
#: its op name and the (checked) kernel name and epilogue text.
PLAN_KEYS = ("dtype", "out_dtype", "layout", "layout_a", "layout_b", "layout_c", "arch", "m", "n", "k", "batch",
             "family", "tile_shape", "warps", "stages", "raster_group", "schedule", "cluster_shape", "raster",
             "activation", "bias", "alpha", "beta", "epilogue", "scale", "fast_accum", "amax", "dtype_b",
             "interleave_k")
ENTRY_KEYS = ("op_name", "kernel", "epilogue_text")


def plans_from_entries(entries: Iterable[dict[str, Any]], defaults: dict[str, Any] | None = None,
                       where: str = "plan") -> tuple[list[Gemm], list[str | None]]:
    """Gemm plans and their op names (None where an entry names none) from dicts of Gemm keyword arguments.

    ``defaults`` fill keys an entry leaves out; an entry's ``kernel``, when present, must be what its
    knobs plan (so a pinned record that no longer reproduces fails loudly instead of drifting).
    """
    plans, names = [], []
    for i, entry in enumerate(entries):
        label = f"{where} {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{label} is {entry!r}: each plan is an object of Gemm keyword arguments, "
                             f"e.g. {{\"dtype\": \"bf16\", \"layout\": \"tn\", \"arch\": 90}}")
        unknown = sorted(set(entry) - set(PLAN_KEYS) - set(ENTRY_KEYS))
        if unknown:
            raise ValueError(f"{label} has unknown key(s) {', '.join(map(repr, unknown))}; valid keys: "
                             f"{', '.join(PLAN_KEYS + ENTRY_KEYS)}")
        kwargs = {**(defaults or {}), **{k: v for k, v in entry.items() if k in PLAN_KEYS}}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        try:
            if isinstance(kwargs.get("epilogue"), (dict, str)):   # a function epilogue, recorded by its structure
                kwargs["epilogue"] = epilogue_from_json(kwargs["epilogue"])
            plan = Gemm(**kwargs)
        except (ValueError, TypeError) as err:   # EpilogueError is a ValueError
            raise ValueError(f"{label}: {err}") from None
        kernel = entry.get("kernel")
        if kernel is not None and kernel != plan.name:
            raise ValueError(f"{label} records kernel {kernel!r} but its knobs now plan {plan.name!r}: "
                             "re-emit from the original plans, or drop the 'kernel' key to accept the new one")
        text = entry.get("epilogue_text")
        if text is not None and text != plan.epilogue.text:
            raise ValueError(f"{label} records the epilogue {text!r} but its keys now give {plan.epilogue.text!r}: "
                             "re-emit from the original plans, or drop the 'epilogue_text' key to accept it")
        plans.append(plan)
        names.append(entry.get("op_name"))
    return plans, names


def _read_plans_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"cannot read the plans file {str(path)!r}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{str(path)!r} is not valid JSON: {err}") from None


def plans_file_autograd(path: str | os.PathLike[str]) -> bool | None:
    """The "autograd" of a plans file (emit's plans.json records it), or None where it says nothing."""
    path = Path(path)
    data = _read_plans_file(path)
    value = data.get("autograd") if isinstance(data, dict) else None
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{str(path)!r}: \"autograd\" must be true or false, got {value!r}")
    return value


def load_plans_file(path: str | os.PathLike[str], defaults: dict[str, Any] | None = None
                    ) -> tuple[list[Gemm], list[str | None]]:
    """Plans from a JSON file: a list of Gemm-kwargs objects, or an object with such a list under "plans"
    (the plans.json that emit writes)."""
    path = Path(path)
    data = _read_plans_file(path)
    entries = data.get("plans") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{str(path)!r} must hold a non-empty JSON list of plans (objects of Gemm keyword "
                         "arguments), or an object with such a list under \"plans\"")
    return plans_from_entries(entries, defaults, where=f"{path.name} plan")
