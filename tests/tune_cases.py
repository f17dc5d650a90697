"""What the CPU tests of generator/tune share: a made-up H100 for the tuning cache's device key, and a tuning table
of the test's own (GEMMGEN_TUNING_DIR), with GEMMGEN_TUNED unset so that recorded winners are used."""
from __future__ import annotations

from pathlib import Path

import pytest

from generator.tune import DeviceKey

H100 = DeviceKey(gpu="NVIDIA H100 80GB HBM3", sm_count=132, cc=90, driver="550.54.15", cuda="12.8.93",
                 torch="2.5.1+cu124")


def own_tuning_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tuning"
    monkeypatch.setenv("GEMMGEN_TUNING_DIR", str(folder))
    monkeypatch.delenv("GEMMGEN_TUNED", raising=False)
    return folder


def no_shipped_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped dispatch tables (generator/tune/tables) replaced by an empty folder, for tests of the user's own
    tuning cache on the made-up H100, which the shipped H100 table would otherwise answer."""
    from generator.tune import shipped

    folder = tmp_path / "no_shipped_tables"
    folder.mkdir()
    monkeypatch.setattr(shipped, "TABLES_DIR", folder)
    shipped.shipped_tables.cache_clear()
    return folder


def visible_h200(monkeypatch: pytest.MonkeyPatch) -> None:
    """arch=None plans for an H200, as on a machine whose GPU is one (the planner's rules measured on that part only)."""
    from dataclasses import replace

    from generator import gemm as gemm_module
    from generator.spec.arch import arch_spec, gpu_part

    spec = replace(arch_spec(90), gpu=gpu_part("NVIDIA H200", 90, 132))
    monkeypatch.setattr(gemm_module, "detect_arch", lambda: (spec, 132))
