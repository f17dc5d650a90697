"""What the planner needs to know about each GPU architecture it can target.

Numbers are per thread block (the opt-in dynamic shared-memory maximum) and per SM, from the
CUDA C++ Programming Guide's table of technical specifications per compute capability.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchSpec:
    cc: int                       # compute capability as an integer: 80 = 8.0
    smem_per_block: int           # bytes one block may opt in to
    smem_per_sm: int              # bytes shared by all resident blocks of one SM
    regs_per_sm: int
    max_threads_per_sm: int
    sm_count: int                 # a typical part; the planner uses the live GPU's count when it has one
    gencode: str                  # nvcc target for code built for this architecture
    hbm_bytes_per_s: float        # the typical part's datasheet memory bandwidth (bound of the small-M kernel)

    @property
    def label(self) -> str:
        return f"sm{self.cc}"


ARCHS: dict[int, ArchSpec] = {
    80: ArchSpec(80, 166912, 167936, 65536, 2048, 108, "-gencode=arch=compute_80,code=sm_80", 2.04e12),  # A100 80GB
    86: ArchSpec(86, 101376, 102400, 65536, 1536, 84, "-gencode=arch=compute_86,code=sm_86", 0.94e12),   # RTX 3090
    89: ArchSpec(89, 101376, 102400, 65536, 1536, 128, "-gencode=arch=compute_89,code=sm_89", 1.01e12),  # RTX 4090
    # sm_90a, not sm_90: wgmma and setmaxnreg exist only in the arch-specific target.
    90: ArchSpec(90, 232448, 233472, 65536, 2048, 132, "-gencode=arch=compute_90a,code=sm_90a", 3.35e12),  # H100 SXM
}


def arch_spec(arch: object) -> ArchSpec:
    """Look up an architecture given as 80, "80", "sm80", "sm_90a" or 9.0; ValueError lists the choices."""
    text = str(arch).lower().removeprefix("sm").removeprefix("_").rstrip("a")
    try:
        cc = int(round(float(text) * 10)) if "." in text else int(text)
    except ValueError:
        cc = -1
    if cc not in ARCHS:
        choices = ", ".join(str(a) for a in ARCHS)
        raise ValueError(f"arch={arch!r} is not an architecture this generator targets; use one of {choices}")
    return ARCHS[cc]


def detect_arch() -> tuple[ArchSpec, int]:
    """The current CUDA device's architecture and SM count. Needs torch and a GPU."""
    hint = "pass arch=80 (Ampere) or arch=90 (Hopper) to plan for a GPU this machine does not have"
    try:
        import torch
    except ImportError:
        raise RuntimeError(f"arch=None asks for the GPU's architecture, but torch is not installed: {hint}") from None
    if not torch.cuda.is_available():
        raise RuntimeError(f"arch=None asks for the GPU's architecture, but no CUDA GPU is visible: {hint}")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    cc = props.major * 10 + props.minor
    if cc not in ARCHS:
        # A newer GPU runs code built for the newest architecture we know only through PTX; refuse plainly.
        raise RuntimeError(f"this GPU is sm{cc}, which the generator has no kernels for yet; {hint}")
    return ARCHS[cc], props.multi_processor_count
