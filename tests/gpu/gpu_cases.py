"""What the GPU numerics tests share (test_numerics.py for the sm80 family, test_sm90.py for sm90): the
error bound per input dtype, the dtypes and layouts every family is checked with, and the ragged sizes
of the foundation issue (M, N, K each drawn from these)."""
from __future__ import annotations

import torch

#: ||D - ref|| / ||ref|| per input dtype.
BOUND = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
LAYOUTS = ("nn", "nt", "tn", "tt")
RAGGED = (1, 7, 8, 63, 64, 65, 127, 129, 1000, 4097)
