"""The committed example under emitted/ equals a fresh rendering of its plan."""
from __future__ import annotations

import json
from pathlib import Path

from generator import Gemm

EXAMPLE = Path(__file__).resolve().parent.parent / "emitted" / "example_sm80_bf16_tn"


def test_committed_example_matches_fresh_render():
    plan = Gemm(**json.loads((EXAMPLE / "plan.json").read_text()))
    fresh = plan.render()
    committed = {p.name: p.read_text() for p in EXAMPLE.glob("*.cu")}
    assert committed.keys() == fresh.keys(), "regenerate: see emitted/README.md"
    for name, text in fresh.items():
        assert committed[name] == text, f"{name} differs from a fresh render: see emitted/README.md"
