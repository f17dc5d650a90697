"""The committed example under emitted/ equals a fresh emit of its plans, byte for byte.

A template, renderer, planner or emit change therefore shows up as a diff of emitted/gemmgen_example/
in review; regenerate with the command in emitted/README.md (checked here to be the one that the test runs).
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from generator import Gemm, emit
from generator.plans import load_plans_file, plans_file_autograd

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "emitted" / "gemmgen_example"
NAME = "gemmgen_example"
PLANS = ["dtype=bf16,layout=tn,arch=90", "dtype=fp16,layout=nn,arch=80"]
# Without the backward kernels: two kernels are enough to show a template change as a diff (the GPU test
# tests/gpu/test_emitted_package.py emits and installs a package with autograd of its own).
REGENERATE = ["python", "-m", "generator", "emit", *(a for p in PLANS for a in ("--plan", p)), "--name", NAME,
              "--no-autograd", "--out", "emitted/gemmgen_example"]
HINT = "regenerate it with the command in emitted/README.md"


def is_build_output(rel: str) -> bool:
    """What `pip install` of the folder leaves in it (ignored by its .gitignore): not part of the example."""
    parts = rel.split("/")
    return (parts[0] in ("build", "dist") or any(p.endswith(".egg-info") or p == "__pycache__" for p in parts)
            or rel.endswith((".so", ".pyc")))


def tree(folder: Path) -> dict[str, bytes]:
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    return {rel: p.read_bytes() for rel, p in files.items() if not is_build_output(rel)}


def assert_same_tree(fresh: Path) -> None:
    committed, emitted = tree(EXAMPLE), tree(fresh)
    assert sorted(committed) == sorted(emitted), f"the committed example has other files than a fresh emit: {HINT}"
    for rel, data in emitted.items():
        assert committed[rel] == data, f"emitted/gemmgen_example/{rel} differs from a fresh emit: {HINT}"


def test_the_readme_gives_the_command_this_test_runs():
    lines = [line.strip() for line in (ROOT / "emitted" / "README.md").read_text().splitlines()]
    commands = [shlex.split(line) for line in lines if line.startswith("python -m generator emit")]
    assert commands == [REGENERATE]


def test_committed_example_matches_a_fresh_emit_from_the_command_line(tmp_path):
    out = tmp_path / NAME
    r = subprocess.run([sys.executable, *REGENERATE[1:-1], str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert_same_tree(out)


def test_committed_example_matches_a_fresh_emit_of_its_plans_json(tmp_path):
    plans, op_names = load_plans_file(EXAMPLE / "plans.json")
    autograd = plans_file_autograd(EXAMPLE / "plans.json")
    assert autograd is False
    out = emit(plans, name=NAME, out=tmp_path / "again", op_names=op_names, autograd=autograd)
    assert_same_tree(out)


def test_committed_example_holds_sources_only():
    names = tree(EXAMPLE)
    r = subprocess.run(["git", "ls-files", "emitted/gemmgen_example"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip():  # in a git checkout: nothing built is tracked
        tracked = [line.removeprefix("emitted/gemmgen_example/") for line in r.stdout.splitlines()]
        built = [n for n in tracked if is_build_output(n) or n.endswith((".o", ".whl"))]
        assert not built, f"build outputs are committed: {built}"
        assert sorted(tracked) == sorted(names), "the example's files are not all committed (git add them)"
    assert {"setup.py", "pyproject.toml", "README.md", "plans.json", f"{NAME}/__init__.py", "csrc/binding.cpp"} <= set(names)
    kernels = sorted(n for n in names if n.endswith(".cu"))
    plans = [Gemm(**kw) for kw in (dict(dtype="bf16", layout="tn", arch=90), dict(dtype="fp16", layout="nn", arch=80))]
    assert kernels == sorted(f"csrc/{p.name}.cu" for p in plans)   # emitted without autograd: no backward kernels
