"""The package's imports point one way, down the stages of the data flow (DESIGN.md), with no circles.

Every import of a ``generator`` module counts, also the ones inside functions and under ``TYPE_CHECKING``:
a lazy import is still a dependency, and a circle hidden behind one is still a circle.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "generator"

# Stages from the bottom up: a module may import its own stage's modules and those of lower stages only.
STAGES = ("spec", "epilogue", "planner", "render", "toolchain", "runtime", "tune", "emit", "gemm", "plans", "nn",
          "quantization", "plot", "cli", "__init__", "__main__")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1 and parts[:-1] != ["generator"]:
        parts = parts[:-1]
    return ".".join(parts)


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The generator modules an ``from ... import ...`` names (a name may be a submodule)."""
    if node.level == 0:
        base = node.module or ""
    else:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    if not base.startswith("generator"):
        return []
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                targets = resolve(module, is_package, node)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("generator")]
            edges[module] |= {t for t in targets if t in files and t != module}
    return edges


def test_every_module_belongs_to_a_stage():
    unknown = sorted(m for m in graph() if stage(m) not in STAGES)
    assert not unknown, f"modules outside the stages of DESIGN.md: {unknown}; add the stage to STAGES in order"


def test_imports_point_down_the_stages():
    upward = [f"{m} -> {t}" for m, targets in graph().items() for t in sorted(targets)
              if STAGES.index(stage(t)) > STAGES.index(stage(m))]
    assert not upward, "imports against the data flow:\n  " + "\n  ".join(upward)


def test_no_import_circles():
    edges = graph()
    done: set[str] = set()
    path: list[str] = []

    def visit(m: str) -> None:
        if m in path:
            circle = path[path.index(m):] + [m]
            raise AssertionError("import circle: " + " -> ".join(circle))
        if m in done:
            return
        path.append(m)
        for t in sorted(edges[m]):
            # a package imports its own submodules to re-export them; that is not a dependency back
            if not t.startswith(m + "."):
                visit(t)
        path.pop()
        done.add(m)

    for module in sorted(edges):
        visit(module)


def test_test_modules_have_unique_names():
    """pytest imports tests/ and tests/gpu/ by basename (no packages): two modules of one name would stop a run that
    collects both (a full GPU run) with "import file mismatch". GPU twins of a CPU test end in _gpu."""
    tests = Path(__file__).resolve().parent
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
