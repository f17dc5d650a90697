"""Which columns past N of a row-padded D does an sm90 kernel write? (docs/defects.md: the sanitizer harness
found the padding of D overwritten.) Prints, per padding column, how many rows lost their NaN and what
was written there."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from generator import Gemm  # noqa: E402

op = Gemm("bf16", "tn", family="sm90", tile_shape=(128, 128, 64), cluster_shape=(1, 1), schedule="ws").compile()
m, k = 193, 200
for n, pitch in ((321, 336), (321, 328), (320, 336), (300, 384)):
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16().t()
    buf = torch.full((m, pitch), float("nan"), dtype=torch.bfloat16, device="cuda")
    op(a, b, out=buf[:, :n])
    torch.cuda.synchronize()
    pad = buf[:, n:].float()
    written = (~torch.isnan(pad)).sum(0).tolist()
    values = [sorted(set(pad[:, j][~torch.isnan(pad[:, j])].tolist()))[:3] for j in range(pad.shape[1])]
    print(f"{op.name} N={n} pitch={pitch} path={op.path(a, b)}: rows written per padding column {written}")
    print(f"   values: {values}")
