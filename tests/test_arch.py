"""The architecture table and the GPU parts (generator/spec/arch.py): the H200 beside the H100 (one chip, more and
faster HBM), the visible GPU found by its driver name, plans on an H200 the same as on an H100, and print(plan)
naming the GPU. CPU only: the visible GPU is a stand-in torch module."""
from __future__ import annotations

import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from generator import Gemm
from generator.spec.arch import ARCHS, GPUS, arch_spec, detect_arch, gpu_part


@pytest.fixture
def visible(monkeypatch: pytest.MonkeyPatch):
    """make(name, cc, sms): a torch whose current CUDA device is that GPU (detect_arch imports torch itself)."""
    def make(name: str, cc: tuple[int, int] = (9, 0), sms: int = 132) -> None:
        props = SimpleNamespace(name=name, major=cc[0], minor=cc[1], multi_processor_count=sms)
        cuda = SimpleNamespace(is_available=lambda: True, current_device=lambda: 0,
                               get_device_properties=lambda device: props)
        # (version and __version__: a plan with size hints asks the device's key for the shipped dispatch tables)
        monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda, version=SimpleNamespace(cuda="13.0"),
                                                                  __version__="2.11.0+cu130"))
    return make


def test_the_h200_is_the_h100s_chip_with_more_and_faster_hbm() -> None:
    h100, h200 = GPUS["h100"], GPUS["h200"]
    assert (h200.name, h200.cc, h200.sm_count, h200.hbm_gb, h200.hbm_bytes_per_s) == ("H200", 90, 132, 141, 4.8e12)
    assert (h100.name, h100.cc, h100.sm_count, h100.hbm_gb, h100.hbm_bytes_per_s) == ("H100 SXM", 90, 132, 80, 3.35e12)
    # 227 KB per block (of 228 KB per SM) on both: one architecture entry serves them
    assert ARCHS[90].smem_per_block == 227 * 1024 and ARCHS[90].smem_per_sm == 228 * 1024


def test_each_architecture_plans_for_a_typical_part_of_its_own() -> None:
    for cc, spec in ARCHS.items():
        assert spec.gpu.cc == cc and spec.gpu in GPUS.values() and not spec.gpu.detected and not spec.gpu.datasheet
        assert (spec.sm_count, spec.hbm_bytes_per_s) == (spec.gpu.sm_count, spec.gpu.hbm_bytes_per_s)
    assert arch_spec("sm_90a") is ARCHS[90] and arch_spec(9.0).gpu.name == "H100 SXM"
    assert arch_spec(80).gpu.name == "A100 80GB"


@pytest.mark.parametrize("driver, cc, name, listed, numbers", [
    ("NVIDIA H200", 90, "H200", "", "h200"),
    ("NVIDIA H200 NVL", 90, "H200 NVL", "H200", "h200"),
    ("NVIDIA H100 80GB HBM3", 90, "H100 80GB HBM3", "H100 SXM", "h100"),
    ("NVIDIA H100 PCIe", 90, "H100 PCIe", "H100 SXM", "h100"),
    # a whole model word: a GH200 is not an H200 (its HBM: the architecture's typical part's)
    ("NVIDIA GH200 480GB", 90, "GH200 480GB", "H100 SXM", "h100"),
    ("NVIDIA A100-SXM4-80GB", 80, "A100-SXM4-80GB", "A100 80GB", "a100"),
    ("NVIDIA GeForce RTX 4090", 89, "GeForce RTX 4090", "RTX 4090", "4090"),
])
def test_the_visible_gpu_by_its_driver_name(driver: str, cc: int, name: str, listed: str, numbers: str) -> None:
    part = gpu_part(driver, cc, 100)
    assert (part.name, part.cc, part.sm_count, part.detected, part.datasheet) == (name, cc, 100, True, listed)
    assert (part.hbm_gb, part.hbm_bytes_per_s) == (GPUS[numbers].hbm_gb, GPUS[numbers].hbm_bytes_per_s)


def test_a_model_word_of_another_architecture_is_not_taken() -> None:
    part = gpu_part("NVIDIA H100 engineering sample", 80, 108)   # the name says H100, the GPU says sm_80
    assert (part.datasheet, part.hbm_bytes_per_s) == ("A100 80GB", GPUS["a100"].hbm_bytes_per_s)


def test_detect_arch_on_an_h200(visible) -> None:
    visible("NVIDIA H200")
    spec, sm_count = detect_arch()
    assert sm_count == 132 and spec.gpu == gpu_part("NVIDIA H200", 90, 132)
    assert (spec.sm_count, spec.hbm_bytes_per_s) == (132, 4.8e12)
    assert replace(spec, gpu=ARCHS[90].gpu) == ARCHS[90]   # everything else is the architecture's


@pytest.mark.parametrize("knobs", [
    dict(),
    dict(m=8, n=4096, k=4096),              # the small-M kernel's bound in plan.why
    dict(m=128, n=4096, k=14336),           # split-K for a long K
    dict(m=512, n=4096, k=4096),
    dict(dtype="fp16", layout="nn"),
    dict(family="sm80"),
    dict(dtype="e4m3", scale="block"),
], ids=str)
def test_an_h200_gets_the_plans_of_an_h100(visible, knobs: dict) -> None:
    """The planner counts SMs and shared memory, which the two share; only the HBM in plan.why differs."""
    h100 = Gemm(arch=90, **knobs)
    visible("NVIDIA H200")
    h200 = Gemm(**knobs)
    assert h200.config == h100.config and h200.estimate.reason == h100.estimate.reason
    # (a small M: the why's bound of the small-M kernel, B streamed once at the HBM's bandwidth, is the H200's)
    assert h200.why.split(" TB/s)")[-1] == h100.why.split(" TB/s)")[-1]
    assert ("at the HBM's 4.80 TB/s" in h200.why) == ("at the HBM's 3.35 TB/s" in h100.why)


def test_print_plan_names_the_gpu(visible) -> None:
    typical = str(Gemm("bf16", "tn", arch=90, m=8, n=4096, k=4096))
    assert ("\ngpu:          H100 SXM (typical of sm_90; arch=None plans for the visible GPU): 132 SMs, 80 GB of HBM at "
            "3.35 TB/s\nwhy:          M = 8 <= 16") in typical
    assert "at the HBM's 3.35 TB/s" in typical
    visible("NVIDIA H200")
    text = str(Gemm("bf16", "tn", m=8, n=4096, k=4096))
    assert "\ngpu:          H200 (the visible GPU): 132 SMs, 141 GB of HBM at 4.80 TB/s\n" in text
    assert "at the HBM's 4.80 TB/s" in text
    assert text.split("\ngpu:")[0] == typical.split("\ngpu:")[0]   # the config's lines


def test_a_gpu_with_fewer_sms_is_planned_with_its_own(visible) -> None:
    visible("NVIDIA H100 PCIe", sms=114)
    plan = Gemm("bf16", "tn")
    assert "over 114 SMs" in plan.why
    assert ("gpu:          H100 PCIe (the visible GPU): 114 SMs, 80 GB of HBM at 3.35 TB/s (as listed for the "
            "H100 SXM)") in str(plan)
