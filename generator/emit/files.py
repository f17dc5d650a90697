"""The package's files: ``package_files`` renders templates/emit through Jinja from the ops' contexts, renders every
kernel, copies the headers the kernels include and the grouped formulas, and records the plans (plans.json)."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import jinja2

from ..render import included_headers, render, templates_dir
from ..spec.config import KernelConfig
from ..tune.cache import Table, bundle_json
from .names import check_op_name, check_operand_names, check_package_name
from .ops import EmittedOp, backward_ops
from .tuned import _routes_context, routes, tuned_op_name

#: The version written into every emitted package.
PACKAGE_VERSION = "0.1.0"
#: Marks a folder as written by emit, so that emitting again may replace it (and nothing else).
MARKER = {"emitted_by": "gemmgen", "format": 1}
PLANS_FILE = "plans.json"

#: nvcc targets per planned architecture. sm_80/86/89 also carry PTX, so newer GPUs can JIT it;
#: sm_90a (wgmma, setmaxnreg) has no forward-compatible PTX.
GENCODE = {
    80: "-gencode=arch=compute_80,code=[sm_80,compute_80]",
    86: "-gencode=arch=compute_86,code=[sm_86,compute_86]",
    89: "-gencode=arch=compute_89,code=[sm_89,compute_89]",
    90: "-gencode=arch=compute_90a,code=sm_90a",
}


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir() / "emit")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def _render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)


def package_files(ops: Sequence[EmittedOp], name: str, autograd: bool = True,
                  tuning: Sequence[Table] = ()) -> dict[str, bytes]:
    """{relative path: content} of the package; pure (reads only the shipped templates and headers).

    ``ops`` are the public ops; with ``autograd``, their backward ops join them in the binding. ``tuning``: tuning
    tables whose winners the package embeds (``routes``): private ops of the winning kernels, which an op's function
    calls for a 2-D call of exactly the sizes they won on, on the GPU they won on."""
    check_package_name(name)
    for op in ops:
        check_op_name(op.name)
        check_operand_names(op.config)
    found = {op.name: routes(op, tuning) for op in ops}
    tuned = {tuned_op_name(r.config): r.config for rs in found.values() for r in rs}
    tuned_ops = [EmittedOp(n, c) for n, c in sorted(tuned.items())]
    grads = backward_ops([*ops, *tuned_ops]) if autograd else []
    files: dict[str, bytes] = {}
    kernels: dict[str, KernelConfig] = {}
    for op in [*ops, *tuned_ops, *grads]:
        kernels.setdefault(op.config.name, op.config)
    for kernel in sorted(kernels):
        for filename, text in render(kernels[kernel]).items():
            files[f"csrc/{filename}"] = text.encode()
    root = templates_dir()
    for header in included_headers():
        files[f"csrc/{header.relative_to(root).as_posix()}"] = header.read_bytes()
    archs = sorted({op.config.arch for op in ops})
    context = {
        "name": name,
        "version": PACKAGE_VERSION,
        "autograd": autograd,
        "ops": [op.context(name, autograd) for op in ops],            # public: functions of __init__.py
        "backward_ops": [op.context(name, autograd) for op in grads],  # private: torch.ops.<name>._grad_*
        "tuned_ops": [op.context(name, autograd) for op in tuned_ops],  # private: torch.ops.<name>._tuned_*
        "kernels": sorted(kernels),
        "archs": archs,
        "gencodes": [GENCODE[a] for a in archs],
        "sources": ["csrc/binding.cpp", *(f"csrc/{k}.cu" for k in sorted(kernels))],
    }
    for op in context["ops"]:
        if found[op["name"]]:
            op.update(routes=_routes_context(found[op["name"]]), call=f'_routed("{op["name"]}", A, B)')
    context["any_routes"] = any(found.values())
    context["all_ops"] = context["ops"] + context["backward_ops"] + context["tuned_ops"]
    context["any_epilogue"] = any(op["epilogue"] for op in context["ops"])
    # __init__.py registers the formulas of the differentiable epilogue ops (a tuned op's too: a call may take it)
    context["formula_ops"] = context["ops"] + context["tuned_ops"]
    context["epilogue_autograd"] = any(op["epilogue"] and op["autograd"] for op in context["formula_ops"])
    context["any_boxed"] = any(op["boxed"] for op in context["ops"])
    context["any_grouped"] = any(op["grouped"] for op in context["all_ops"])
    context["any_grouped_scaled"] = any(op["grouped_scaled"] for op in context["all_ops"])
    context.update(_grouped_formula_context(context["all_ops"]))
    if context["grouped_formula_ops"]:
        files[f"{name}/{GROUPED_FORMULA_MODULE}.py"] = grouped_formula_source()
    for template, path in _PACKAGE_TEMPLATES:
        files[path.format(name=name)] = _render(template, **context).encode()
    record = {**MARKER, "name": name, "autograd": autograd, "plans": [op.plan_record() for op in ops],
              "backward_kernels": [op.config.name for op in grads]}
    if tuned_ops:   # the tables it embeds, as an export: emit --tuning <package>/plans.json takes them again
        record["tuning"] = bundle_json(list(tuning))
    files[PLANS_FILE] = (json.dumps(record, indent=2) + "\n").encode()
    return dict(sorted(files.items()))


#: The module of a package emitted with autograd that holds the formulas of its grouped calls: a copy of
#: generator/runtime/grouped_formula.py (torch only), which gemmgen's JIT ops use too.
GROUPED_FORMULA_MODULE = "_grouped_formula"


def grouped_formula_source() -> bytes:
    """generator/runtime/grouped_formula.py, byte for byte: read as a file, not imported (emitting needs no torch)."""
    return (Path(__file__).resolve().parents[1] / "runtime" / "grouped_formula.py").read_bytes()


def _grouped_formula_context(all_ops: list[dict[str, Any]]) -> dict[str, Any]:
    """What __init__.py needs to register the grouped formulas: the differentiable ops with grouped overloads (the
    backward ops too: double backward), and the backward ops those formulas call (each op's ``grads``), sorted. The
    others (fp8, int8, every op of a package without autograd) keep binding.cpp's refusal of grad."""
    formula_ops = [op for op in all_ops if op["grouped"] and op["autograd"]]
    by_name = {op["name"]: op for op in all_ops}
    called = sorted({op["grads"][order][which] for op in formula_ops for order in ("row", "col") for which in "ab"})
    return {"grouped_formula_ops": formula_ops, "grouped_grad_ops": [by_name[name] for name in called],
            "grouped_formula_module": GROUPED_FORMULA_MODULE,
            # grouped ops that keep binding.cpp's refusal of grad beside the formulas (fp8 and int8 ones)
            "any_grouped_refusing": any(op["grouped"] and not op["autograd"] for op in all_ops)}


#: (template in templates/emit, path in the package) of the files rendered from the package's context.
_PACKAGE_TEMPLATES = (
    ("binding.cpp.j2", "csrc/binding.cpp"),
    ("__init__.py.j2", "{name}/__init__.py"),
    ("setup.py.j2", "setup.py"),
    ("pyproject.toml.j2", "pyproject.toml"),
    ("README.md.j2", "README.md"),
    ("MANIFEST.in.j2", "MANIFEST.in"),
    ("gitignore.j2", ".gitignore"),
)
