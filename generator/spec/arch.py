"""What the planner needs to know about each GPU architecture it can target, and the GPU parts it knows by name.

Numbers are per thread block (the opt-in dynamic shared-memory maximum) and per SM, from the
CUDA C++ Programming Guide's table of technical specifications per compute capability; a part's SM count and
memory are its datasheet's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GpuSpec:
    """One GPU part: what a plan reads beyond its architecture. The planner counts its SMs (a visible GPU's own
    count replaces the datasheet's); ``plan.why`` quotes its HBM bandwidth (the small-M kernel's bound). Parts of one
    architecture share its shared memory and instructions, so they get the same plans when their SMs agree (the
    H100 and the H200), but for a rule measured on one part only (``part``: planner.sm90 FILLING_PINGPONG_PARTS)."""

    name: str                     # as print(plan) says it: "H200"
    cc: int                       # compute capability as an integer: 90 = 9.0
    sm_count: int
    hbm_gb: int                   # memory, in the datasheet's GB
    hbm_bytes_per_s: float        # datasheet memory bandwidth
    detected: bool = False        # the visible GPU (arch=None), not a typical part of the architecture
    datasheet: str = ""           # the listed part whose HBM numbers these are, where the GPU is not listed by its name

    @property
    def part(self) -> str:
        """The listed part this GPU is: "H200" for the driver's "NVIDIA H200" and for an "H200 NVL" alike."""
        return self.datasheet or self.name

    def describe(self) -> str:
        """One line for print(plan)."""
        where = "the visible GPU" if self.detected else f"typical of sm_{self.cc}; arch=None plans for the visible GPU"
        hbm = f"{self.hbm_gb} GB of HBM at {self.hbm_bytes_per_s / 1e12:.2f} TB/s"
        if self.datasheet:
            hbm += f" (as listed for the {self.datasheet})"
        return f"{self.name} ({where}): {self.sm_count} SMs, {hbm}"


#: The parts known by name, keyed by the model word of the driver's name ("NVIDIA H200" -> "h200").
GPUS: dict[str, GpuSpec] = {
    "a100": GpuSpec("A100 80GB", 80, 108, 80, 2.04e12),
    "3090": GpuSpec("RTX 3090", 86, 82, 24, 0.94e12),   # GA102 with 82 of its 84 SMs enabled
    "4090": GpuSpec("RTX 4090", 89, 128, 24, 1.01e12),
    "h100": GpuSpec("H100 SXM", 90, 132, 80, 3.35e12),
    "h200": GpuSpec("H200", 90, 132, 141, 4.8e12),    # the H100's chip (SMs, shared memory) with more, faster HBM
}


@dataclass(frozen=True)
class ArchSpec:
    cc: int                       # compute capability as an integer: 80 = 8.0
    smem_per_block: int           # bytes one block may opt in to
    smem_per_sm: int              # bytes shared by all resident blocks of one SM
    regs_per_sm: int
    max_threads_per_sm: int
    gencode: str                  # nvcc target for code built for this architecture
    gpu: GpuSpec                  # the part planned for: a typical one (arch=80, 90, ...) or the visible GPU

    @property
    def label(self) -> str:
        return f"sm{self.cc}"

    @property
    def sm_count(self) -> int:
        """The part's SMs; the planner uses the live GPU's count when it has one."""
        return self.gpu.sm_count

    @property
    def hbm_bytes_per_s(self) -> float:
        """The part's datasheet memory bandwidth (bound of the small-M kernel)."""
        return self.gpu.hbm_bytes_per_s


ARCHS: dict[int, ArchSpec] = {
    80: ArchSpec(80, 166912, 167936, 65536, 2048, "-gencode=arch=compute_80,code=sm_80", GPUS["a100"]),
    86: ArchSpec(86, 101376, 102400, 65536, 1536, "-gencode=arch=compute_86,code=sm_86", GPUS["3090"]),
    89: ArchSpec(89, 101376, 102400, 65536, 1536, "-gencode=arch=compute_89,code=sm_89", GPUS["4090"]),
    # sm_90a, not sm_90: wgmma and setmaxnreg exist only in the arch-specific target. (H100 and H200 alike.)
    90: ArchSpec(90, 232448, 233472, 65536, 2048, "-gencode=arch=compute_90a,code=sm_90a", GPUS["h100"]),
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


def gpu_part(name: str, cc: int, sm_count: int) -> GpuSpec:
    """The visible GPU that the driver calls ``name`` (torch.cuda.get_device_name), by that name and with its own SM
    count; its HBM numbers those of the part of GPUS whose model word the name has ("NVIDIA H200" -> H200; a whole
    word, so a GH200 is not an H200), else of the architecture's typical part."""
    name = name.removeprefix("NVIDIA ").strip() or name
    words = re.split(r"[^0-9a-z]+", name.lower())
    listed = next((GPUS[w] for w in words if w in GPUS and GPUS[w].cc == cc), ARCHS[cc].gpu)
    datasheet = "" if listed.name == name else listed.name
    return replace(listed, name=name, sm_count=sm_count, detected=True, datasheet=datasheet)


def detect_arch() -> tuple[ArchSpec, int]:
    """The current CUDA device's architecture (its ``gpu`` the part itself) and SM count. Needs torch and a GPU."""
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
    sm_count = props.multi_processor_count
    return replace(ARCHS[cc], gpu=gpu_part(props.name, cc, sm_count)), sm_count
