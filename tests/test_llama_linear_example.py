"""examples/llama_linear.py without a GPU: its flags, the Llama config it builds, and its clean skip (exit 0, one
line saying what it skipped and why) where it cannot run. The run itself needs a CUDA GPU and transformers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from example_scripts import imported_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "llama_linear.py"


@pytest.fixture(scope="module")
def script():
    with imported_script(SCRIPT, "llama_linear_example") as module:
        yield module


def test_defaults(script, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    args = script.parse_args([])
    assert (args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads, args.vocab) == \
        (8, 2048, 5632, 16, 8, 32000)
    assert (args.prefill_batch, args.prefill_len, args.decode_batches) == (4, 512, [1, 8])
    assert not args.no_compile and not args.no_reduce_overhead
    assert args.json == Path("llama_linear.json")


def test_flags_and_the_json_path_under_out(script, monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    args = script.parse_args(["--layers", "16", "--hidden", "1024", "--intermediate", "2816", "--prefill-batch", "2",
                              "--prefill-len", "256", "--decode-batches", "1,4,8", "--no-compile"])
    assert (args.layers, args.hidden, args.intermediate, args.prefill_batch, args.prefill_len) == \
        (16, 1024, 2816, 2, 256)
    assert args.decode_batches == [1, 4, 8] and args.no_compile
    assert args.json == tmp_path / "llama_linear.json"
    assert script.parse_args(["--json", "x/y.json"]).json == Path("x/y.json")


@pytest.mark.parametrize("argv", [["--decode-batches", "1,x"], ["--decode-batches", "0"], ["--decode-batches", ""],
                                  ["--hidden", "2050"], ["--kv-heads", "5"]])
def test_bad_flags_exit_2(script, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        script.parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_config_and_its_linear_layers(script):
    args = script.parse_args(["--layers", "16", "--kv-heads", "4"])
    config = script.llama_config_kwargs(args)
    assert config["num_hidden_layers"] == 16 and config["num_key_value_heads"] == 4
    assert config["attn_implementation"] == "sdpa" and config["tie_word_embeddings"] is False
    assert config["max_position_embeddings"] >= max(args.prefill_len, args.decode_context + 1)
    shapes = script.linear_shapes(args)
    assert shapes["k_proj"] == (512, 2048) and shapes["down_proj"] == (2048, 5632)
    assert shapes["lm_head"] == (32000, 2048)
    # the counts LlamaForCausalLM of transformers 5.17 has for these configs (checked on the meta device)
    assert script.parameter_count(script.parse_args([])) == 508_594_176
    assert script.parameter_count(args) == 852_559_872


def test_parameter_count_matches_transformers(script):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    args = script.parse_args(["--layers", "2", "--hidden", "256", "--intermediate", "512", "--heads", "4",
                              "--kv-heads", "2", "--vocab", "1000"])
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**script.llama_config_kwargs(args)))
    assert sum(p.numel() for p in model.parameters()) == script.parameter_count(args)
    linears = {(m.out_features, m.in_features) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert linears == set(script.linear_shapes(args).values())


def test_skips_cleanly_without_a_gpu(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path)}
    r = subprocess.run([sys.executable, str(SCRIPT), "--layers", "2"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llama_linear: skipped ")
    assert "Llama 2 layers" in lines[0]
    assert any(why in lines[0] for why in ("no CUDA GPU is visible", "torch is not installed"))
    assert not (tmp_path / "llama_linear.json").exists()


def _smoke_run(script, monkeypatch, tmp_path, scale: float) -> tuple[int, dict]:
    """The script's transformers calls (config, StaticCache prefill, rewound decode, fp32 reference, rows, JSON) on
    the CPU, at a tiny size and eager only, with the GPU pieces stubbed: generator Linear layers by F.linear on
    weights times ``scale`` (1.0: the stock arithmetic), do_bench by a CPU timer."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import json

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
    monkeypatch.setattr(bench, "bench_ms", lambda fn: (fn(), 1.0)[1])
    out = tmp_path / "rows.json"
    rc = script.main(["--layers", "2", "--hidden", "128", "--intermediate", "256", "--heads", "4", "--kv-heads", "2",
                      "--vocab", "500", "--prefill-batch", "2", "--prefill-len", "32", "--decode-batches", "1,3",
                      "--decode-context", "8", "--rounds", "2", "--no-compile", "--train-batch", "2", "--train-len",
                      "16", "--json", str(out)])
    return rc, json.loads(out.read_text())


def test_transformers_calls_on_cpu(script, monkeypatch, tmp_path, capsys):
    rc, data = _smoke_run(script, monkeypatch, tmp_path, 1.0)
    assert rc == 0, capsys.readouterr().out
    assert data["swapped"] == 2 * 7 + 1
    assert [(r["case"], r["mode"]) for r in data["rows"]] == \
        [("prefill 2x32", "eager"), ("decode b1", "eager"), ("decode b3", "eager"), ("train step 2x16", "eager")]
    for r in data["rows"]:
        assert r["ok"] and r["ours_vs_stock"] == 0.0 and 0 < r["stock_vs_fp32"] < 2e-2 and r["speedup"] == 1.0


def test_a_wrong_linear_fails_the_check(script, monkeypatch, tmp_path, capsys):
    rc, data = _smoke_run(script, monkeypatch, tmp_path, 1.25)
    assert rc == 1
    assert not any(r["ok"] for r in data["rows"])
    assert "FAILED" in capsys.readouterr().out
