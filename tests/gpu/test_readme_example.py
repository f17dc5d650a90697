"""README.md's example, run as written (tests/test_readme.py checks it without a GPU)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_readme import readme_example  # noqa: E402

pytestmark = pytest.mark.gpu


def test_readme_example_runs():
    namespace: dict[str, object] = {}
    exec(compile(readme_example(), "README.md (Example)", "exec"), namespace)
    from generator.nn import Linear
    assert isinstance(namespace["model"][0], Linear)
