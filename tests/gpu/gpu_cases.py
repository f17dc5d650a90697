"""What the GPU numerics tests share (test_numerics.py for the sm80 family, test_sm90.py for sm90): the
error bound per input dtype, the dtypes and layouts every family is checked with, and the ragged sizes
of the foundation issue (M, N, K each drawn from these); and for the tests that build one module's plans of both
families at once (batched, grouped, list): the ops this GPU runs, and a skip for the others."""
from __future__ import annotations

import torch

#: ||D - ref|| / ||ref|| per input dtype.
BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
LAYOUTS = ("nn", "nt", "tn", "tt")
RAGGED = (1, 7, 8, 63, 64, 65, 127, 129, 1000, 4097)

#: Whether this GPU runs the sm90 family's kernels (built for sm_90a: compute capability 9.0 exactly).
IS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def ops_for_this_gpu(configs: dict, namespace: str) -> dict:
    """{key: op} for the configs ({key: KernelConfig}) this GPU runs (sm80 everywhere, sm90 on an sm_90 GPU), built
    in one parallel ninja run."""
    from generator.runtime import compile_many

    wanted = {key: cfg for key, cfg in configs.items() if IS_SM90 or cfg.family == "sm80"}
    return dict(zip(wanted, compile_many(list(wanted.values()), namespace=namespace)))


def op_of(ops: dict, key: str):
    """``ops[key]``, or a skip where this GPU does not run its kernel."""
    import pytest

    if key not in ops:
        pytest.skip("sm90 kernels need an sm_90 GPU")
    return ops[key]
