"""Writing a package: ``write_package`` puts the files into the folder ``out``, built beside it and moved into
place, and replaces only a folder that emit wrote before."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .files import MARKER, PLANS_FILE


def _is_emitted_package(folder: Path) -> bool:
    try:
        record = json.loads((folder / PLANS_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and all(record.get(k) == v for k, v in MARKER.items())


def write_package(files: dict[str, bytes], out: str | os.PathLike[str]) -> Path:
    """Write ``files`` as the folder ``out``: built beside it, then moved into place.

    ``out`` may be missing, an empty folder, or a package emitted before (replaced whole, build
    outputs included); anything else is refused, so a typo cannot delete someone's folder.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out={str(out)!r} is a file: give a folder to write the package into")
    if out.is_dir() and any(out.iterdir()) and not _is_emitted_package(out):
        raise ValueError(f"out={str(out)!r} is a folder that emit did not write (no {PLANS_FILE} from gemmgen): "
                         f"give a new or empty folder, e.g. emitted/<name>")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.emit-", dir=out.parent))
    try:
        for rel, data in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            os.chmod(path, 0o644)
        os.chmod(staging, 0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
