"""Which device a measurement holds for: the GPU, its SM count and everything else that changes a kernel's time
(driver, the CUDA toolkit that builds the kernels, torch, the config space's version). A tuned result is used only
on a device whose key is the same (docs/tuning.md)."""
from __future__ import annotations

import ctypes
import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..spec.config import CONFIG_SPACE_VERSION

#: Where the Linux driver says its version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15 ...").
_PROC_DRIVER = Path("/proc/driver/nvidia/version")


@dataclass(frozen=True)
class DeviceKey:
    """What a tuning table's measurements hold for; one table file per key."""

    gpu: str            # torch.cuda.get_device_name(): "NVIDIA H100 80GB HBM3"
    sm_count: int
    cc: int             # compute capability as an integer: 90
    driver: str         # the kernel module's version, else the driver API's CUDA version
    cuda: str           # the nvcc release that builds the kernels ("12.8.93"), else torch's CUDA
    torch: str
    config_space: int = CONFIG_SPACE_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object, where: str) -> DeviceKey:
        names = [f.name for f in fields(cls)]
        if not isinstance(data, dict) or sorted(data) != sorted(names):
            raise ValueError(f"{where}: \"device\" must be an object with exactly the keys {', '.join(names)}")
        ints = ("sm_count", "cc", "config_space")
        for name in names:
            want = int if name in ints else str
            if not isinstance(data[name], want) or isinstance(data[name], bool):
                raise ValueError(f"{where}: device {name!r} must be a{'n integer' if want is int else ' string'}, "
                                 f"got {data[name]!r}")
        return cls(**data)

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def file_name(self) -> str:
        """The table's file name: readable GPU and SM count, then the digest of the whole key."""
        slug = re.sub(r"[^0-9a-z]+", "-", self.gpu.lower()).strip("-") or "gpu"
        return f"{slug}-{self.sm_count}sm-{self.digest}.json"

    def describe(self) -> str:
        return (f"{self.gpu} ({self.sm_count} SMs, sm_{self.cc}), driver {self.driver}, CUDA {self.cuda}, "
                f"torch {self.torch}, config space {self.config_space}")

    def differences(self, other: DeviceKey) -> list[str]:
        """The fields in which ``other`` differs from this key, as 'name: ours != theirs'."""
        return [f"{f.name}: {getattr(self, f.name)!r} != {getattr(other, f.name)!r}" for f in fields(self)
                if getattr(self, f.name) != getattr(other, f.name)]


def driver_version() -> str:
    """The NVIDIA kernel module's version (Linux), else the CUDA version of the driver API, else 'unknown'."""
    try:
        match = re.search(r"Kernel Module\s+([0-9][0-9.]*)", _PROC_DRIVER.read_text())
        if match:
            return match.group(1)
    except OSError:
        pass
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"cuda-driver-api {version.value}"
    except (OSError, AttributeError):
        pass
    return "unknown"


def cuda_version(torch_cuda: str | None) -> str:
    """The release of the nvcc that builds the kernels ("12.8.93"; memoized by the builder), else torch's CUDA."""
    from ..toolchain import BuildError, nvcc_path, nvcc_version

    try:
        text = nvcc_version(nvcc_path())
    except BuildError:
        return f"torch-cuda {torch_cuda}"
    match = re.search(r"V(\d+\.\d+\.\d+)", text) or re.search(r"release (\d+\.\d+)", text)
    return match.group(1) if match else text.splitlines()[-1].strip()


@lru_cache(maxsize=None)
def _device_key(index: int) -> DeviceKey:
    import torch

    props = torch.cuda.get_device_properties(index)
    return DeviceKey(gpu=props.name, sm_count=props.multi_processor_count, cc=props.major * 10 + props.minor,
                     driver=driver_version(), cuda=cuda_version(torch.version.cuda), torch=str(torch.__version__))


def current_device(*, import_torch: bool = True) -> DeviceKey | None:
    """The key of the current CUDA device; None without torch or a visible GPU. ``import_torch=False`` answers None
    where torch is not imported yet instead of importing it (a second or more, where a plan needs no GPU)."""
    if "torch" not in sys.modules and not import_torch:
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return _device_key(torch.cuda.current_device())
