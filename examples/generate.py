"""Greedy generation with transformers' ``model.generate()`` and a static KV cache, every nn.Linear on generated
kernels, next to the stock model: tokens/s, the tokens themselves, and what building the kernels costs.

    python examples/generate.py                               # Llama, 8 layers, hidden 2048; batch 1 and 16
    python examples/generate.py --batches 1,4,16 --new-tokens 256 --json out.json
    python examples/generate.py --checkpoint ~/models/llama   # a local checkpoint directory instead (no download)
    python examples/generate.py --no-compile                  # eager rows only

The client: a ``transformers`` causal LM (a ``LlamaForCausalLM`` from a small ``LlamaConfig`` with random weights,
fixed seed, bf16, sdpa attention, as examples/llama_linear.py builds it; or ``--checkpoint PATH``, loaded in bf16
from that directory) on the GPU, and a deep copy whose nn.Linear layers ``generator.nn.replace_linear`` swaps for
``generator.nn.Linear``. Both run ``model.generate(prompt, do_sample=False, max_new_tokens=min_new_tokens=
--new-tokens, cache_implementation="static")`` on the same random prompt of --prompt-len tokens per sequence, at each
batch size of --batches (min_new_tokens keeps an end-of-sequence token from stopping a sequence early, so that every
call generates the same number of tokens).

Modes, per batch size, each for the stock model and ours:

* eager: ``disable_compile=True``. With a static cache on a CUDA device, transformers 5 compiles the decode step by
  itself unless told not to, so this flag is what makes the row eager.
* compile reduce-overhead: the transformers way for a static cache: ``compile_config=CompileConfig(mode=
  "reduce-overhead", fullgraph=False, dynamic=False)`` (--compile-mode picks another mode). generate() then runs
  the prefill eagerly and every decode step through ``model.get_compiled_call(compile_config)``, a
  ``torch.compile`` of the model's forward that it keeps on the model (one per model, so stock and ours each
  compile theirs; CUDA graphs under reduce-overhead). Nothing is patched by hand, so this is what a user of
  transformers gets; a row whose generate did not compile (transformers decided the criteria were unmet) fails.

The token check. With random weights the logits have many near-ties, and two bf16 models that sum in different
orders (cuBLAS and our kernels, or eager and Inductor) may pick different tokens at one of them; from then on the
two sequences have different contexts and nothing after is comparable. So "the same as stock" is checked where it
can be: for each sequence, at every position up to and including the first one where ours' token differs from
stock's in the same mode (the positions whose contexts are still identical), generate's logits must agree,
||ours - stock|| / ||stock|| <= 2e-2 (REL_BOUND, examples/llama_linear.py's bound for two bf16 models); at that first
difference, if any, the two tokens must have been a near-tie for stock: stock's logit of its token minus its logit
of ours' token at most 8 times the RMS of the logits' difference there (TIE_SIGMAS) plus two bf16 ulps of the larger
of the two logits (what rounding each model's two logits to bf16 alone can flip). A flip always has a margin within
the two logits' own differences; the rule asks that those be no outliers among the differences over the whole
vocabulary. A wrong kernel fails the first part (logits off everywhere) or the second (a token chosen against a
clear margin, as an error concentrated on a few outputs would choose it). Reported per row: how many sequences are
identical to stock's, the fewest positions any sequence matched before its first difference (--new-tokens when all
are identical), and the largest logits difference compared. Compiled rows also note how the stock model's compiled
tokens compare with its eager ones (Inductor's own rounding).

Timing: tokens/s = batch x --new-tokens / the wall time of one generate() call (prefill of the prompt, every decode
step and generate's own work on the host: what a client waits for), the median of --rounds calls per model, stock
and ours in interleaved order (benchmarks/bench.py's interleaved_rounds), after the check call and one more warm-up
call. The ratio is ours / stock (> 1 when ours is faster). Each row's notes give the quartiles of the per-round ratios
(stock's call over ours' in the same round): a host-bound row moves by a few per cent between rounds and machines,
and where that spread includes 1.0 the run does not tell the row from parity.

One-time costs: the wall time of ``replace_linear`` (plans and builds every bucket's kernel for each distinct Linear
shape, or loads them from the build cache) is printed before the table; each row has each model's first generate()
call (for compiled rows: dynamo, Inductor and the CUDA-graph recording of the decode step at that batch size). The
default model has 5 distinct Linear shapes to build kernels for, and the default run compiles four decode graphs
(stock and ours at two batch sizes); fewer --batches, --no-compile or fewer --new-tokens and --rounds shorten it.

Prints one table and writes the rows as JSON to --json (default $OUT/generate.json if $OUT is set, else
./generate.json), rewritten after every row. Without a CUDA GPU, torch or transformers it prints one line saying
what it skipped and why, and exits 0. Exit status 1 when a row fails the token check.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

try:
    import torch
except ImportError:  # the skip message and --help do not need torch
    torch = None

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # llama_linear beside this file, also when loaded by path (the tests)

from llama_linear import (  # noqa: E402
    REL_BOUND, counter_totals, describe, llama_config_kwargs, parse_batches, raise_recompile_limit, skip_reasons,
)

DEVICE = "cuda"        # where the models run (the CPU test runs the transformers calls on "cpu")
TIE_SIGMAS = 8.0       # a first difference must be a near-tie: stock's margin <= this x the RMS logits difference
                       # (+ two bf16 ulps)
MODES = ("reduce-overhead", "default", "max-autotune", "max-autotune-no-cudagraphs")


def default_json_path() -> Path:
    """$OUT/generate.json where $OUT is set (the GPU machine's result folder), else ./generate.json."""
    out = os.environ.get("OUT")
    return Path(out) / "generate.json" if out else Path("generate.json")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected a positive integer")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=None, metavar="PATH",
                   help="a local transformers checkpoint directory (causal LM) instead of the random Llama below")
    p.add_argument("--layers", type=int, default=8, help="decoder layers (random Llama)")
    p.add_argument("--hidden", type=int, default=2048, help="hidden size (random Llama)")
    p.add_argument("--intermediate", type=int, default=5632, help="MLP intermediate size (random Llama)")
    p.add_argument("--heads", type=int, default=16, help="attention heads (random Llama)")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads (random Llama)")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary size (random Llama)")
    p.add_argument("--batches", type=parse_batches, default=[1, 16], metavar="B,B,...",
                   help="batch sizes: sequences per generate() call")
    p.add_argument("--prompt-len", type=positive_int, default=128, help="prompt tokens per sequence")
    p.add_argument("--new-tokens", type=positive_int, default=128, help="tokens generated per sequence")
    p.add_argument("--rounds", type=positive_int, default=5, help="timed generate() calls per model and row")
    p.add_argument("--no-compile", action="store_true", help="eager rows only")
    p.add_argument("--compile-mode", choices=MODES, default="reduce-overhead", help="torch.compile mode of the "
                   "compiled rows")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and the prompts")
    p.add_argument("--json", type=Path, default=None, help="where to write the rows (default: $OUT/generate.json "
                   "if $OUT is set, else ./generate.json)")
    args = p.parse_args(argv)
    if args.checkpoint is not None and not args.checkpoint.expanduser().is_dir():
        p.error(f"--checkpoint {args.checkpoint}: not a directory")
    if args.checkpoint is None and (args.hidden % args.heads or args.heads % args.kv_heads):
        p.error(f"--hidden {args.hidden} must divide into --heads {args.heads}, and --heads into --kv-heads "
                f"{args.kv_heads}")
    if args.json is None:
        args.json = default_json_path()
    return args


def llama_args(args: argparse.Namespace) -> argparse.Namespace:
    """The flags as examples/llama_linear.py's helpers read them: its prefill is our prompt, and its decode context
    the longest sequence generate() reaches (what max_position_embeddings must cover)."""
    return argparse.Namespace(**vars(args), prefill_len=args.prompt_len,
                              decode_context=args.prompt_len + args.new_tokens)


def what(args: argparse.Namespace) -> str:
    """The model in words, before it is loaded."""
    return f"the checkpoint {args.checkpoint}" if args.checkpoint else describe(llama_args(args))


# ---------------------------------------------------------------------------------------------------------------
# The token check and the table: pure functions of tensors and rows (the CPU tests run them).


@dataclass
class Match:
    """How ours' generated tokens compare with stock's (see the module's docstring for the rule)."""

    sequences: int
    identical: int                  # sequences whose every new token equals stock's
    shortest_prefix: int            # the fewest positions a sequence matched before its first difference
    worst_rel: float                # the largest ||ours - stock|| / ||stock|| of the logits compared
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at magnitude ``x`` (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(max(x, 2.0 ** -126))) - 7)


def matching_prefix(stock: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
    """(batch,) the number of leading positions where the (batch, tokens) ids agree (tokens: all of them)."""
    differs = stock != ours
    first = differs.int().argmax(dim=1)
    return torch.where(differs.any(dim=1), first, torch.full_like(first, stock.shape[1]))


def compare_tokens(stock: torch.Tensor, ours: torch.Tensor, stock_logits: list[torch.Tensor] | tuple,
                   ours_logits: list[torch.Tensor] | tuple) -> Match:
    """Check ours' new tokens (batch, T) against stock's, with each call's logits per step (T tensors of
    (batch, vocab)): the logits agree wherever the contexts are identical, and a first difference is a near-tie."""
    prefix = matching_prefix(stock, ours)
    tokens = stock.shape[1]
    failures: list[str] = []
    worst = 0.0
    for i in range(stock.shape[0]):
        last = min(int(prefix[i]), tokens - 1)                   # the first difference, or the last position
        s = torch.stack([stock_logits[t][i] for t in range(last + 1)]).float()
        o = torch.stack([ours_logits[t][i] for t in range(last + 1)]).float()
        rel = ((o - s).norm(dim=1) / s.norm(dim=1)).nan_to_num(nan=0.0)
        worst = max(worst, float(rel.max()))
        if float(rel.max()) > REL_BOUND:
            t = int(rel.argmax())
            failures.append(f"sequence {i}: logits differ by {float(rel[t]):.1e} > {REL_BOUND:.0e} (position {t}, "
                            f"the worst of the {last + 1} compared)")
        elif prefix[i] < tokens:
            a, b = int(stock[i, last]), int(ours[i, last])
            margin = float(s[-1, a] - s[-1, b])
            spread = float((o[-1] - s[-1]).pow(2).mean().sqrt())
            rounding = 2 * bf16_ulp(max(abs(float(s[-1, a])), abs(float(s[-1, b]))))
            if margin > TIE_SIGMAS * spread + rounding:
                failures.append(f"sequence {i}: position {last} took token {b} for {a}, a margin of {margin:.3g} "
                                f"in stock's logits > {TIE_SIGMAS:g} x the logits' RMS difference {spread:.2g} + "
                                f"{rounding:.2g} (two bf16 ulps)")
    return Match(sequences=stock.shape[0], identical=int((prefix == tokens).sum()),
                 shortest_prefix=int(prefix.min()), worst_rel=worst, failures=failures)


@dataclass
class Row:
    batch: int
    mode: str
    new_tokens: int
    stock_tps: float | None = None          # new tokens per second, all sequences of the batch together
    ours_tps: float | None = None
    speedup: float | None = None            # ours_tps / stock_tps: > 1 when ours is faster
    # the quartiles of stock's time over ours' in each timed round (the two calls of a round run back to back):
    # how far the ratio moves within the run, beside the median's ratio above
    spread: tuple[float, float] | None = None
    identical: int | None = None            # sequences identical to stock's (same mode)
    shortest_prefix: int | None = None      # the fewest positions matched before a first difference
    worst_rel: float | None = None          # the largest logits difference compared
    ok: bool | None = None
    first_call_s: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None


def paired_spread(stock_s: list[float], ours_s: list[float]) -> tuple[float, float]:
    """The lower and upper quartiles of stock_s[i] / ours_s[i] (each round's two interleaved calls paired): a ratio
    whose spread straddles 1.0 is not told from parity by this run."""
    ratios = sorted(s / o for s, o in zip(stock_s, ours_s))
    if len(ratios) < 2:
        return ratios[0], ratios[0]
    low, _, high = statistics.quantiles(ratios, n=4, method="inclusive")
    return low, high


TABLE_HEAD = (f"{'batch':>5}  {'mode':<26} {'stock tok/s':>11} {'ours tok/s':>11} {'ours/stock':>10}  "
              f"{'identical':>9} {'prefix':>6} {'logits':>7}  check  notes")


def format_row(r: Row) -> str:
    head = f"{r.batch:>5}  {r.mode:<26}"
    if r.skipped:
        return f"{head} skipped: {r.skipped}"
    spread = [f"rounds' ratios {r.spread[0]:.3f}-{r.spread[1]:.3f}"] if r.spread else []
    notes = spread + ["first calls " + ", ".join(f"{k} {v:.1f} s" for k, v in r.first_call_s.items())] + r.notes
    return (f"{head} {r.stock_tps:11.1f} {r.ours_tps:11.1f} {r.speedup:9.3f}x  "
            f"{f'{r.identical}/{r.batch}':>9} {r.shortest_prefix:>6} {r.worst_rel:7.1e}  "
            f"{'ok    ' if r.ok else 'FAILED'} {'; '.join(notes)}")


def write_json(path: Path, meta: dict[str, Any], rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=1, default=str) + "\n")


def summarize(rows: list[Row], json_path: Path) -> int:
    timed = [r for r in rows if not r.skipped]
    failed = [r for r in timed if not r.ok]
    if timed:
        worst = min(timed, key=lambda r: r.speedup)
        within = (f"; its rounds' ratios span {worst.spread[0]:.3f}-{worst.spread[1]:.3f}"
                  + (", which includes 1.0" if worst.spread[0] <= 1.0 <= worst.spread[1] else "")
                  if worst.spread else "")
        print(f"\nlowest ours/stock: {worst.speedup:.3f}x (batch {worst.batch}, {worst.mode}){within}")
    print(f"tokens: {len(timed) - len(failed)} of {len(timed)} rows pass the token check" +
          ("" if not failed else " — FAILED: " + ", ".join(f"batch {r.batch} {r.mode}" for r in failed)))
    for r in failed:
        for reason in r.failures[:3]:
            print(f"  batch {r.batch} {r.mode}: {reason}")
    print(f"wrote {json_path}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------------------
# GPU side: everything below runs only with a CUDA GPU, torch and transformers.


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def load_stock(args: argparse.Namespace) -> Any:
    """The stock model in bf16 with sdpa attention, on DEVICE: the checkpoint's, or the random Llama."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if args.checkpoint is not None:
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint.expanduser(), dtype=torch.bfloat16,
                                                     attn_implementation="sdpa", local_files_only=True)
        return model.to(DEVICE).eval()
    torch.manual_seed(args.seed)
    with torch.device(DEVICE):          # initialize on the GPU: seconds instead of a minute on the CPU
        model = LlamaForCausalLM(LlamaConfig(**llama_config_kwargs(llama_args(args))))
    return model.to(torch.bfloat16).eval()


def with_generated_linears(stock: Any) -> tuple[Any, int, float]:
    """A copy of ``stock`` with generated Linear layers, how many were swapped, and replace_linear's wall time."""
    from generator.nn import replace_linear

    ours = copy.deepcopy(stock)         # before any generate(): the copy carries no compiled forward of stock's
    start = time.perf_counter()
    swapped = replace_linear(ours)      # plans for this GPU, builds every bucket's kernel (cached), swaps in place
    synchronize()
    return ours, swapped, time.perf_counter() - start


def describe_model(model: Any, args: argparse.Namespace) -> str:
    if args.checkpoint is None:
        return describe(llama_args(args))
    c = model.config
    return (f"{args.checkpoint} ({c.model_type}, {c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab "
            f"{c.vocab_size}, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, bf16)")


def compile_config(mode: str) -> Any:
    """What generate() compiles its decode step with: static shapes (one graph per batch size), graph breaks
    allowed (a model that breaks still runs, and the row notes how many breaks it had)."""
    from transformers import CompileConfig

    return CompileConfig(mode=mode, fullgraph=False, dynamic=False)


def generate_fn(model: Any, prompt: torch.Tensor, new_tokens: int, config: Any | None) -> Callable[..., Any]:
    """model.generate() on ``prompt``, greedy, static cache; eager when ``config`` is None, else compiled with it.
    Called with check=True it also returns each step's logits (for the token check; not in timed calls)."""
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                  do_sample=False, cache_implementation="static", disable_compile=config is None,
                  compile_config=config)

    def generate(check: bool = False) -> Any:
        extra = dict(return_dict_in_generate=True, output_logits=True) if check else {}
        return model.generate(prompt, **kwargs, **extra)

    return generate


def wall_seconds(fn: Callable[[], Any]) -> float:
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start


def run_row(models: dict[str, Any], prompt: torch.Tensor, mode: str, args: argparse.Namespace,
            eager_tokens: torch.Tensor | None) -> tuple[Row, torch.Tensor]:
    """One batch size in one mode: the check call (timed as the first call), a warm-up call, then --rounds timed
    calls per model in interleaved order. Returns the row and the stock model's new tokens."""
    from bench import interleaved_rounds, warm_up_gpu

    batch = prompt.shape[0]
    row = Row(batch, mode, args.new_tokens)
    config = None if mode == "eager" else compile_config(mode.removeprefix("compile "))
    calls = {which: generate_fn(model, prompt, args.new_tokens, config) for which, model in models.items()}
    before = counter_totals()
    outputs = {}
    for which, call in calls.items():
        start = time.perf_counter()
        outputs[which] = call(check=True)
        synchronize()
        row.first_call_s[which] = round(time.perf_counter() - start, 2)
    new = {which: out.sequences[:, prompt.shape[1]:] for which, out in outputs.items()}
    if any(t.shape[1] != args.new_tokens for t in new.values()):
        raise RuntimeError(f"generate() returned {[t.shape[1] for t in new.values()]} new tokens, not "
                           f"{args.new_tokens}")
    match = compare_tokens(new["stock"], new["ours"], outputs["stock"].logits, outputs["ours"].logits)
    del outputs                         # the logits of every step: large at batch 16 with a big vocabulary
    row.identical, row.shortest_prefix, row.worst_rel = match.identical, match.shortest_prefix, match.worst_rel
    row.failures = match.failures
    if config is not None:
        not_compiled = [w for w, m in models.items() if getattr(m, "_compiled_call", None) is None]
        if not_compiled:
            row.failures.append(f"generate() did not compile the decode step of {', '.join(not_compiled)}")
        if eager_tokens is not None:
            own = matching_prefix(eager_tokens, new["stock"])
            row.notes.append(f"stock compiled vs eager: {int((own == args.new_tokens).sum())}/{batch} identical, "
                             f"prefix {int(own.min())}")
    row.ok = not row.failures
    for call in calls.values():         # warm-up: a compiled row's graphs recorded, nothing left to build
        call()
    row.notes += [f"{n} {name}" for name, n in ((k, v - before[k]) for k, v in counter_totals().items()) if n]
    warm_up_gpu(1.0)                    # the GPU idled while compiling: ramp the clocks back up
    seconds = interleaved_rounds(calls, args.rounds, wall_seconds)
    tps = {which: batch * args.new_tokens / statistics.median(t) for which, t in seconds.items()}
    row.stock_tps, row.ours_tps = tps["stock"], tps["ours"]
    row.speedup = row.ours_tps / row.stock_tps
    row.spread = paired_spread(seconds["stock"], seconds["ours"])
    return row, new["stock"]


def run_on_gpu(args: argparse.Namespace) -> int:
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # bench.py's timing helpers; generator from a checkout
    import transformers

    from bench import warm_up_gpu

    # Per batch size, stock and ours each compile their forward (one code object, so they share dynamo's count).
    raise_recompile_limit()
    device = torch.cuda.get_device_name()
    stock = load_stock(args)
    ours, swapped, build_s = with_generated_linears(stock)
    print(f"{describe_model(stock, args)} on {device}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}", flush=True)
    print(f"replace_linear swapped {swapped} nn.Linear layers in {build_s:.1f} s (planning and building the kernels, "
          "or loading them from the build cache)", flush=True)
    modes = ["eager"] + ([] if args.no_compile else [f"compile {args.compile_mode}"])
    meta = {"model": describe_model(stock, args), "config": stock.config.to_dict(),
            "parameters": sum(p.numel() for p in stock.parameters()), "device": device, "torch": torch.__version__,
            "transformers": transformers.__version__, "swapped": swapped, "build_s": round(build_s, 1),
            "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "rounds": args.rounds, "modes": modes,
            "rel_bound": REL_BOUND, "tie_sigmas": TIE_SIGMAS}

    gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
    models = {"stock": stock, "ours": ours}
    rows: list[Row] = []
    warm_up_gpu()
    print(f"\n{TABLE_HEAD}", flush=True)
    for batch in args.batches:
        prompt = torch.randint(0, stock.config.vocab_size, (batch, args.prompt_len), device=DEVICE, generator=gen)
        eager_tokens = None
        for mode in modes:
            try:
                row, stock_tokens = run_row(models, prompt, mode, args, eager_tokens)
            except Exception as err:  # a compile mode that fails here is reported, not fatal
                if mode == "eager":
                    raise
                first_line = (str(err).strip().splitlines() or [""])[0][:300]
                row = Row(batch, mode, args.new_tokens, skipped=f"{type(err).__name__}: {first_line}")
            else:
                eager_tokens = stock_tokens if mode == "eager" else eager_tokens
            rows.append(row)
            print(format_row(row), flush=True)
            write_json(args.json, meta, rows)
    return summarize(rows, args.json)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reasons = skip_reasons()
    if reasons:
        modes = "eager" if args.no_compile else f"eager and torch.compile {args.compile_mode}"
        print(f"generate: skipped greedy generate() with a static cache on {what(args)}, stock and with every "
              f"nn.Linear on generated kernels (batches {','.join(map(str, args.batches))}, {modes}) — "
              f"{'; '.join(reasons)}")
        return 0
    return run_on_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
