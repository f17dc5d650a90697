"""What the tests of examples/ share: importing an example script as a module (tests/test_*_example.py)."""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


@contextmanager
def imported_script(path: Path, name: str) -> Iterator[ModuleType]:
    """The script at ``path`` imported as module ``name``, registered in sys.modules while in use (its dataclasses
    look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
