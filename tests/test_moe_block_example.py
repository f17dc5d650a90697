"""examples/moe_block.py on the CPU: its routing and combine against a dense per-token computation (with a loop of
matmuls standing in for the grouped products), and its run without a GPU, which plans and says what it skipped.
The training steps and their timing are the GPU machine's (`python examples/moe_block.py`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from example_scripts import imported_script

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "moe_block.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT, "moe_block_example") as module:
        yield module


def looped(rows, w, ends):
    """The grouped product as one matmul per group (rows @ W[g].t())."""
    out, start = [], 0
    for g, end in enumerate(ends.tolist()):
        out.append(rows[start:end] @ w[g].t())
        start = end
    return torch.cat(out)


@pytest.mark.parametrize("routing", ["uniform", "dirichlet", "zipf"])
def test_block_equals_each_token_through_its_experts(script, routing):
    E, k, d, inter, T = 6, 2, 16, 8, 40
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    x = torch.randn(T, d, dtype=torch.float64)
    router = torch.randn(E, d, dtype=torch.float64, generator=gen)
    w1 = torch.randn(E, 2 * inter, d, dtype=torch.float64, generator=gen)
    w2 = torch.randn(E, d, inter, dtype=torch.float64, generator=gen)
    bias = script.router_bias(E, routing, gen).double()
    y = script.moe_block(x, router, bias, w1, w2, k, looped, looped)
    probs = (x @ router.t() + bias).softmax(-1)
    for t in range(T):
        weights, experts = probs[t].topk(k)
        want = sum(wt / weights.sum() * (w2[e] @ (torch.nn.functional.silu(w1[e, :inter] @ x[t])
                                                  * (w1[e, inter:] @ x[t])))
                   for wt, e in zip(weights, experts.tolist()))
        # (the router's softmax and the combine's weights are fp32, as a bf16 block keeps them)
        assert torch.allclose(y[t], want, rtol=1e-5, atol=1e-5), t
    tokens, _, ends = script.route(x @ router.t() + bias, k)
    assert ends.dtype == torch.int32 and ends[-1] == T * k and (ends.diff() >= 0).all()
    assert sorted(tokens.tolist()) == sorted(list(range(T)) * k)


def test_skewed_routing_leaves_groups_uneven(script):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    bias = script.router_bias(64, "dirichlet", gen)
    logits = torch.randn(4096, 64, generator=gen) * 0.1 + bias
    _, _, ends = script.route(logits, 8)
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    assert sizes.max() > 4 * sizes.float().mean()     # a few hot experts
    assert script.expected_rows(script.parse_args([])) == 8192 * 8 // 64


def test_without_a_gpu_it_plans_and_says_what_it_skipped(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# gate and up: 64 experts" in r.stdout and "# down: 64 experts" in r.stdout
    assert "no CUDA GPU here" in r.stdout and "skipped building them" in r.stdout
