"""Host time of one nn.Linear call at decode sizes: torch's nn.Linear, generator.nn.Linear's direct path (contiguous
input and weight in the compute dtype: the op's overload called with no argument binding) and its general path (the
checks, casts and copies any input takes), side by side. A decoding step in eager mode is host-bound, so this is
what examples/llama_linear.py's eager decode rows compare per layer. Writes $OUT/linear_overhead.json.

    python3 gpu/linear_overhead.py
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from generator.nn import Linear  # noqa: E402
from overhead import host_us  # noqa: E402

OUT = Path(os.environ.get("OUT", "."))
#: (out_features, in_features, bias, fused activation) of a small Llama's layers (the gate projection with its SiLU
#: fused, as replace_linear makes it), and the token counts of a decoding step.
LAYERS = [(2048, 2048, False, None), (5632, 2048, False, None), (5632, 2048, False, "silu"), (2048, 2048, True, None)]
ACTIVATIONS = {None: lambda y: y, "silu": torch.nn.functional.silu}
TOKENS = (1, 8)


def main() -> None:
    rows = []
    for n, k, has_bias, activation in LAYERS:
        linear = nn.Linear(k, n, bias=has_bias, device="cuda", dtype=torch.bfloat16)
        act = ACTIVATIONS[activation]
        ours = Linear(linear, activation=activation)

        def stock(x, linear=linear, act=act):
            return act(linear(x))
        for tokens in TOKENS:
            x = torch.randn(tokens, 1, k, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                ref = stock(x)
                general = lambda: ours._forward_general(x, ours.weight, ours.bias)   # noqa: E731
                for label, out in (("direct", ours(x)), ("general", general())):
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    assert err < 2e-2, f"{label} path: {err:.2e} against nn.Linear"
                calls = {"nn.Linear": lambda: stock(x), "gemmgen direct": lambda: ours(x),
                         "gemmgen general": general}
                operands = () if linear.bias is None else (linear.bias,)
                path = ours.op.path(x.view(-1, k), ours.weight.t(), *operands)
                row = {"n": n, "k": k, "bias": has_bias, "activation": activation, "tokens": tokens, "path": path}
                for label, fn in calls.items():
                    row[f"{label} host us"] = host_us(fn)
                    row[f"{label} ms"] = do_bench(fn, warmup=25, rep=100, return_mode="median")
            rows.append(row)
            print(json.dumps(row), flush=True)
    (OUT / "linear_overhead.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
