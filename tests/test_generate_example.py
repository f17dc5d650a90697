"""examples/generate.py without a GPU: its flags, --help, its clean skip (exit 0, one line saying what it skipped and
why), the token check (compare_tokens on made-up logits), the table and the exit status; and, where transformers is
importable, its generate() calls on the CPU (eager rows, stubbed Linear layers). The timed run needs a CUDA GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from example_scripts import imported_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "generate.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT, "generate_example") as module:
        yield module


def run_script(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


# --- flags ------------------------------------------------------------------------------------------------------


def test_defaults(script, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    args = script.parse_args([])
    assert args.checkpoint is None
    assert (args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads, args.vocab) == \
        (8, 2048, 5632, 16, 8, 32000)
    assert (args.batches, args.prompt_len, args.new_tokens, args.rounds) == ([1, 16], 128, 128, 5)
    assert not args.no_compile and args.compile_mode == "reduce-overhead"
    assert args.json == Path("generate.json")


def test_flags_and_the_json_path_under_out(script, monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    args = script.parse_args(["--batches", "1,4,16", "--new-tokens", "256", "--prompt-len", "64", "--no-compile",
                              "--checkpoint", str(tmp_path), "--compile-mode", "default"])
    assert args.batches == [1, 4, 16] and (args.new_tokens, args.prompt_len) == (256, 64)
    assert args.no_compile and args.checkpoint == tmp_path and args.compile_mode == "default"
    assert args.json == tmp_path / "generate.json"
    assert script.parse_args(["--json", "x/y.json"]).json == Path("x/y.json")


@pytest.mark.parametrize("argv", [["--batches", "1,x"], ["--batches", "0"], ["--new-tokens", "0"],
                                  ["--rounds", "-1"], ["--hidden", "2050"], ["--compile-mode", "fast"],
                                  ["--checkpoint", "/nonexistent/checkpoint"]])
def test_bad_flags_exit_2(script, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        script.parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_the_random_llama_covers_every_position(script):
    """llama_linear's config helper, fed our flags: positions up to prompt + new tokens."""
    args = script.parse_args(["--prompt-len", "2000", "--new-tokens", "300", "--layers", "2"])
    config = script.llama_config_kwargs(script.llama_args(args))
    assert config["max_position_embeddings"] >= 2300 and config["num_hidden_layers"] == 2
    assert config["attn_implementation"] == "sdpa"
    assert script.what(args).startswith("Llama 2 layers")
    assert script.what(script.parse_args(["--checkpoint", str(ROOT)])) == f"the checkpoint {ROOT}"


def test_help_exits_0():
    r = run_script("--help")
    assert r.returncode == 0, r.stderr
    for flag in ("--checkpoint", "--batches", "--new-tokens", "--rounds", "--no-compile", "--json"):
        assert flag in r.stdout


def test_skips_cleanly_without_a_gpu(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path)}
    r = run_script("--layers", "2", "--batches", "1,16", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("generate: skipped ")
    assert "Llama 2 layers" in lines[0] and "batches 1,16" in lines[0]
    assert any(why in lines[0] for why in ("no CUDA GPU is visible", "torch is not installed"))
    assert not (tmp_path / "generate.json").exists()


# --- the token check --------------------------------------------------------------------------------------------


def made_up(torch, batch=3, steps=5, vocab=40, seed=0):
    """Stock's (batch, steps) greedy tokens and its logits per step, each step's argmax its token."""
    gen = torch.Generator().manual_seed(seed)
    logits = [torch.randn(batch, vocab, generator=gen) for _ in range(steps)]
    tokens = torch.stack([step.argmax(dim=1) for step in logits], dim=1)
    return tokens, logits


def test_identical_tokens_and_logits_pass(script):
    torch = pytest.importorskip("torch")
    tokens, logits = made_up(torch)
    m = script.compare_tokens(tokens, tokens.clone(), logits, [t.clone() for t in logits])
    assert m.ok and (m.sequences, m.identical, m.shortest_prefix, m.worst_rel) == (3, 3, 5, 0.0)


def test_bf16_ulp(script):
    torch = pytest.importorskip("torch")
    for x in (1.0, 1.5, 3.0, 0.3, 100.0):
        up = torch.tensor(x, dtype=torch.bfloat16).nextafter(torch.tensor(float("inf"), dtype=torch.bfloat16))
        assert script.bf16_ulp(x) == float(up) - float(torch.tensor(x, dtype=torch.bfloat16))


def test_matching_prefix(script):
    torch = pytest.importorskip("torch")
    a = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    b = torch.tensor([[1, 2, 3, 4], [1, 9, 3, 4], [0, 2, 3, 4]])
    assert script.matching_prefix(a, b).tolist() == [4, 1, 0]


def flip(torch, tokens, logits, seq, step, margin):
    """Stock's logits with its runner-up at (``step``, ``seq``) ``margin`` below its token; ours: those logits plus
    small noise, sequence ``seq`` taking the runner-up at ``step`` and other tokens after it (other contexts, so
    unrelated logits there)."""
    gen = torch.Generator().manual_seed(1)
    stock_logits = [t.clone() for t in logits]
    a, b = (int(i) for i in stock_logits[step][seq].topk(2).indices)
    stock_logits[step][seq, b] = stock_logits[step][seq, a] - margin
    ours_logits = [t + 1e-3 * torch.randn(t.shape, generator=gen) for t in stock_logits]
    ours_tokens = tokens.clone()
    ours_tokens[seq, step] = b
    ours_tokens[seq, step + 1:] = (tokens[seq, step + 1:] + 1) % logits[0].shape[1]
    for t in range(step + 1, len(logits)):
        ours_logits[t][seq] = torch.randn(logits[0].shape[1], generator=gen)
    return ours_tokens, stock_logits, ours_logits


def test_a_near_tie_flipped_by_rounding_passes(script):
    torch = pytest.importorskip("torch")
    tokens, logits = made_up(torch)
    ours, stock_logits, ours_logits = flip(torch, tokens, logits, seq=1, step=2, margin=1e-4)
    m = script.compare_tokens(tokens, ours, stock_logits, ours_logits)
    assert m.ok, m.failures
    assert (m.identical, m.shortest_prefix) == (2, 2) and 0 < m.worst_rel < 1e-2


def test_a_token_against_a_clear_margin_fails(script):
    torch = pytest.importorskip("torch")
    tokens, logits = made_up(torch)
    ours, stock_logits, ours_logits = flip(torch, tokens, logits, seq=0, step=1, margin=0.5)
    m = script.compare_tokens(tokens, ours, stock_logits, ours_logits)
    assert m.worst_rel < 1e-2                              # the logits agree: only the margin fails
    assert not m.ok and len(m.failures) == 1
    assert m.failures[0].startswith("sequence 0: position 1 took token") and "margin of 0.5" in m.failures[0]


def test_logits_off_before_any_difference_fail(script):
    torch = pytest.importorskip("torch")
    tokens, logits = made_up(torch)
    ours_logits = [t * 1.25 for t in logits]               # same argmax everywhere, every logit 25 % off
    m = script.compare_tokens(tokens, tokens.clone(), logits, ours_logits)
    assert m.identical == 3 and not m.ok and len(m.failures) == 3
    assert "differ by 2.5e-01" in m.failures[0] and abs(m.worst_rel - 0.25) < 1e-6


# --- the table, the JSON and the exit status ---------------------------------------------------------------------


def a_row(script, **kw):
    values = dict(batch=16, mode="compile reduce-overhead", new_tokens=128, stock_tps=1234.5, ours_tps=1500.25,
                  speedup=1500.25 / 1234.5, identical=15, shortest_prefix=37, worst_rel=3.2e-3, ok=True,
                  first_call_s={"stock": 41.26, "ours": 38.0}, notes=["stock compiled vs eager: 14/16 identical"])
    values.update(kw)
    return script.Row(**values)


def test_format_row_lines_up_with_the_head(script):
    line = script.format_row(a_row(script))
    head = script.TABLE_HEAD
    assert line.index("compile reduce-overhead") == head.index("mode")
    assert line[:head.index("ours/stock") + len("ours/stock")].endswith("1.215x")
    assert "15/16" in line and " 37 " in line and "3.2e-03" in line and "ok" in line
    assert "first calls stock 41.3 s, ours 38.0 s; stock compiled vs eager: 14/16 identical" in line
    assert "FAILED" in script.format_row(a_row(script, ok=False))
    skipped = script.format_row(script.Row(1, "compile reduce-overhead", 128, skipped="BackendCompilerFailed: x"))
    assert skipped.endswith("skipped: BackendCompilerFailed: x")


def test_paired_spread(script):
    """Quartiles of each round's stock / ours; a single round is its own spread."""
    low, high = script.paired_spread([1.0, 1.1, 0.9, 1.0, 1.2], [1.0, 1.0, 1.0, 1.0, 1.0])
    assert (round(low, 6), round(high, 6)) == (1.0, 1.1)
    assert script.paired_spread([2.0], [1.0]) == (2.0, 2.0)


def test_the_spread_is_in_the_row_and_the_summary(script, tmp_path, capsys):
    row = a_row(script)
    row.spread = (0.97, 1.02)
    assert "rounds' ratios 0.970-1.020" in script.format_row(row)
    script.summarize([row], tmp_path / "rows.json")
    assert "its rounds' ratios span 0.970-1.020, which includes 1.0" in capsys.readouterr().out


def test_json_and_exit_status(script, tmp_path, capsys):
    out = tmp_path / "sub" / "rows.json"
    rows = [a_row(script, mode="eager"), a_row(script),
            script.Row(1, "compile reduce-overhead", 128, skipped="BackendCompilerFailed: x")]
    script.write_json(out, {"build_s": 12.3}, rows)
    data = json.loads(out.read_text())
    assert data["build_s"] == 12.3 and len(data["rows"]) == 3
    assert data["rows"][1]["first_call_s"] == {"stock": 41.26, "ours": 38.0} and data["rows"][2]["skipped"]
    assert script.summarize(rows, out) == 0
    rows[1].ok, rows[1].failures = False, ["sequence 3: logits differ by 2.5e-01 > 2e-02 (position 0, ...)"]
    assert script.summarize(rows, out) == 1
    printed = capsys.readouterr().out
    assert "FAILED: batch 16 compile reduce-overhead" in printed and "sequence 3: logits" in printed


# --- the transformers calls on the CPU (where transformers is importable) ----------------------------------------


def _smoke_run(script, monkeypatch, tmp_path, scale: float, *flags: str) -> tuple[int, dict]:
    """The script's transformers calls (random Llama, generate() with a static cache and per-step logits, the token
    check, rows, JSON) on the CPU at a tiny size, with the GPU pieces stubbed: generator Linear layers by F.linear on
    weights times ``scale`` (1.0: the stock arithmetic), the GPU warm-up by nothing."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch.nn.functional as F
    from torch import nn

    import generator.nn

    class ScaledLinear(nn.Module):
        def __init__(self, linear: nn.Linear) -> None:
            super().__init__()
            self.weight = linear.weight

        def forward(self, x):
            return F.linear(x, self.weight * scale)

    def replace_linear(model, **_):
        swapped = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
                   if type(child) is nn.Linear]
        for parent, name, child in swapped:
            setattr(parent, name, ScaledLinear(child))
        return len(swapped)

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    monkeypatch.setattr(script, "DEVICE", "cpu")
    monkeypatch.setattr(script, "skip_reasons", lambda: [])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu")
    monkeypatch.setattr(generator.nn, "replace_linear", replace_linear)
    monkeypatch.setattr(bench, "warm_up_gpu", lambda seconds=2.0: None)
    out = tmp_path / "rows.json"
    rc = script.main(["--layers", "2", "--hidden", "64", "--intermediate", "128", "--heads", "4", "--kv-heads", "2",
                      "--vocab", "300", "--batches", "1,3", "--prompt-len", "8", "--new-tokens", "6", "--rounds", "2",
                      "--json", str(out), *flags])
    return rc, json.loads(out.read_text())


def test_generate_on_cpu(script, monkeypatch, tmp_path, capsys):
    rc, data = _smoke_run(script, monkeypatch, tmp_path, 1.0, "--no-compile")
    assert rc == 0, capsys.readouterr().out
    assert data["swapped"] == 2 * 7 + 1 and data["new_tokens"] == 6
    assert [(r["batch"], r["mode"]) for r in data["rows"]] == [(1, "eager"), (3, "eager")]
    for r in data["rows"]:
        assert r["ok"] and r["identical"] == r["batch"] and r["shortest_prefix"] == 6 and r["worst_rel"] == 0.0
        assert r["stock_tps"] > 0 and r["ours_tps"] > 0 and set(r["first_call_s"]) == {"stock", "ours"}


def test_wrong_linear_layers_fail_the_token_check(script, monkeypatch, tmp_path, capsys):
    rc, data = _smoke_run(script, monkeypatch, tmp_path, 1.25, "--no-compile")
    assert rc == 1
    assert not any(r["ok"] for r in data["rows"]) and all(r["failures"] for r in data["rows"])
    assert "FAILED" in capsys.readouterr().out


def test_a_generate_that_did_not_compile_fails(script, monkeypatch, tmp_path):
    """generate() compiles only on accelerators: on the CPU the compiled rows run eagerly, and the row says so."""
    rc, data = _smoke_run(script, monkeypatch, tmp_path, 1.0, "--batches", "2")
    assert rc == 1
    eager, compiled = data["rows"]
    assert eager["ok"] and compiled["mode"] == "compile reduce-overhead" and not compiled["ok"]
    assert compiled["failures"] == ["generate() did not compile the decode step of stock, ours"]
    assert compiled["notes"][0] == "stock compiled vs eager: 2/2 identical, prefix 6"
