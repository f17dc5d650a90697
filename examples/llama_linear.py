"""A Llama-architecture transformers model with every nn.Linear on generated kernels, next to the stock model.

    python examples/llama_linear.py                           # 8 layers, hidden 2048, prefill 4x512, decode b1 and b8
    python examples/llama_linear.py --layers 16 --decode-batches 1,4,8 --json out.json
    python examples/llama_linear.py --no-compile              # eager rows only (no torch.compile time)
    python examples/llama_linear.py --train-batch 2           # also an eager training step (forward + backward)

Builds a ``transformers.LlamaForCausalLM`` from a small ``LlamaConfig`` (random weights, fixed seed, bf16, sdpa
attention, untied lm_head) on the GPU, and a deep copy whose nn.Linear layers (q, k, v, o, gate, up, down of every
layer, and lm_head) ``generator.nn.replace_linear`` swaps for ``generator.nn.Linear``: without ``m=`` each layer's op
holds a kernel per bucket of M, so prefill and decode each get theirs (under torch.compile too: the graph calls one
op over every bucket's kernel, which picks per call).

What is timed (ms, the median over --rounds of triton.testing.do_bench medians, stock and ours measured in
interleaved rounds, benchmarks/bench.py's timed_rounds), for the stock model and ours side by side:

* prefill: ``model(input_ids=(prefill_batch, prefill_len), use_cache=False)``, the logits of every position.
* decode bN: one token per sequence, ``model(input_ids=(N, 1), past_key_values=cache, use_cache=True)``, on a
  transformers StaticCache that a prefill of --decode-context tokens filled (untimed) with max_cache_len =
  context + 1. The call writes the new token's keys and values at position ``context``; the timed step first
  rewinds the cache's length to ``context`` (one torch._foreach_copy_ of the layers' length tensors, inside the
  timed region, the same for both models) so that every call decodes the same position.
* each in eager mode and under ``torch.compile`` (default mode, dynamic=False), decode also under
  ``mode="reduce-overhead"`` (CUDA graphs); a mode that fails is reported as skipped with its error.

Correctness first: every row's first outputs (the compiled modes' after warm-up calls) are compared with the
stock eager model's logits, ||ours - stock|| / ||stock||, and both with an fp32 copy of the stock model (the
same bf16 weights, upcast). A row passes when ours is within 2e-2 of stock, or when ours' error against fp32 is
at most twice the stock model's. Eager decode at batch 1-8 likely waits on the host (Python per layer), so its
ratio may compare the two Linear modules' per-call overhead more than the kernels.

Run time: replace_linear builds up to three kernels per distinct Linear shape (cached afterwards), and the
compiled rows compile one graph per model, case and mode (ten with the defaults: each row prints its first calls'
seconds); --no-reduce-overhead, fewer --decode-batches or fewer --layers shorten a run.

Prints one table (case, mode, stock ms, ours ms, stock/ours, the differences) and writes the rows as JSON to
--json (default $OUT/llama_linear.json if $OUT is set, else ./llama_linear.json), rewritten after every row so
that a run stopped by a time limit keeps the rows it measured. Without a CUDA GPU, torch or transformers it
prints one line saying what it skipped and why, and exits 0. Exit status 1 when a row fails the correctness check.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

try:
    import torch
except ImportError:  # the skip message and --help do not need torch
    torch = None

ROOT = Path(__file__).resolve().parent.parent
DEVICE = "cuda"        # where the models run (tests run the transformers calls on "cpu")
REL_BOUND = 2e-2        # two bf16 models, each within 1e-2 of the exact logits
ACCURACY_RATIO = 2.0    # or: ours' error against fp32 at most this times the stock model's


def parse_batches(text: str) -> list[int]:
    """'1,8' -> [1, 8]: the decode batch sizes."""
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,8") from None
    if not batches or any(b < 1 for b in batches):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive batch sizes, e.g. 1,8")
    return batches


def default_json_path() -> Path:
    """$OUT/llama_linear.json where $OUT is set (the GPU machine's result folder), else ./llama_linear.json."""
    out = os.environ.get("OUT")
    return Path(out) / "llama_linear.json" if out else Path("llama_linear.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layers", type=int, default=8, help="decoder layers")
    p.add_argument("--hidden", type=int, default=2048, help="hidden size")
    p.add_argument("--intermediate", type=int, default=5632, help="MLP intermediate size")
    p.add_argument("--heads", type=int, default=16, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads (grouped-query attention)")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary size (lm_head's out_features)")
    p.add_argument("--prefill-batch", type=int, default=4, help="sequences in the prefill forward")
    p.add_argument("--prefill-len", type=int, default=512, help="tokens per sequence in the prefill forward")
    p.add_argument("--decode-batches", type=parse_batches, default=[1, 8], metavar="B,B,...",
                   help="batch sizes of the one-token decode step")
    p.add_argument("--decode-context", type=int, default=128, help="tokens in the KV cache before the decode step")
    p.add_argument("--train-batch", type=int, default=0,
                   help="sequences of the training-step row (forward, cross-entropy loss, backward; eager): 0 leaves "
                        "it out")
    p.add_argument("--train-len", type=int, default=1024, help="tokens per sequence in the training step")
    p.add_argument("--rounds", type=int, default=5, help="interleaved do_bench rounds per row")
    p.add_argument("--no-compile", action="store_true", help="eager rows only")
    p.add_argument("--no-reduce-overhead", action="store_true", help="skip the reduce-overhead (CUDA graph) rows")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the token ids")
    p.add_argument("--json", type=Path, default=None, help="where to write the rows (default: $OUT/llama_linear.json "
                   "if $OUT is set, else ./llama_linear.json)")
    args = p.parse_args(argv)
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error(f"--hidden {args.hidden} must divide into --heads {args.heads}, and --heads into --kv-heads "
                f"{args.kv_heads}")
    if args.json is None:
        args.json = default_json_path()
    return args


def llama_config_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The LlamaConfig of the run, as keyword arguments (no transformers needed to make them)."""
    return dict(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(2048, args.prefill_len, args.decode_context + 1),
        tie_word_embeddings=False,      # lm_head its own Linear (a tied one would share the embedding's weight)
        attn_implementation="sdpa",     # the same attention for both models, and one that torch.compile traces
    )


def linear_shapes(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    """{name: (out_features, in_features)} of the Linear layers of one decoder layer and of lm_head."""
    h, kv = args.hidden, args.hidden // args.heads * args.kv_heads
    return {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h),
            "gate_proj": (args.intermediate, h), "up_proj": (args.intermediate, h), "down_proj": (h, args.intermediate),
            "lm_head": (args.vocab, h)}


def parameter_count(args: argparse.Namespace) -> int:
    """The model's parameters: the Linear weights, the embedding and the RMSNorm weights."""
    shapes = linear_shapes(args)
    per_layer = sum(n * k for name, (n, k) in shapes.items() if name != "lm_head") + 2 * args.hidden
    n, k = shapes["lm_head"]
    return args.layers * per_layer + n * k + args.vocab * args.hidden + args.hidden


def describe(args: argparse.Namespace) -> str:
    return (f"Llama {args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}, {args.heads} heads "
            f"({args.kv_heads} KV), vocab {args.vocab}, {parameter_count(args) / 1e9:.2f}B parameters, bf16")


def skip_reasons() -> list[str]:
    """Why this machine cannot run the comparison (empty when it can)."""
    if torch is None:
        return ["torch is not installed"]
    reasons = [] if torch.cuda.is_available() else ["no CUDA GPU is visible"]
    try:
        import transformers  # noqa: F401
    except ImportError:
        reasons.append("transformers is not installed")
    return reasons


# ---------------------------------------------------------------------------------------------------------------
# GPU side: everything below runs only with a CUDA GPU, torch and transformers.


@dataclass
class Case:
    """One workload: a step per model (stock, ours, fp32 reference) made from that model's callable."""

    name: str
    make_step: Callable[[str, Callable], Callable[[], torch.Tensor]]
    reference: torch.Tensor | None = None       # the fp32 model's logits
    stock_eager: torch.Tensor | None = None     # the stock model's eager logits, what every row is compared with


@dataclass
class Row:
    case: str
    mode: str
    stock_ms: float | None = None
    ours_ms: float | None = None
    speedup: float | None = None                  # stock_ms / ours_ms: > 1 when ours is faster
    ours_vs_stock: float | None = None            # ||ours - stock eager|| / ||stock eager||
    stock_vs_fp32: float | None = None
    ours_vs_fp32: float | None = None
    ok: bool | None = None
    compile_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def build_models(args: argparse.Namespace) -> tuple[Any, Any, int, float]:
    """The stock model, the copy with generated Linear layers, how many layers were swapped, and the build time."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from generator.nn import replace_linear

    config = LlamaConfig(**llama_config_kwargs(args))
    torch.manual_seed(args.seed)
    with torch.device(DEVICE):          # initialize on the GPU: seconds instead of a minute on the CPU
        stock = LlamaForCausalLM(config)
    stock = stock.to(torch.bfloat16).eval()
    ours = copy.deepcopy(stock)
    start = time.perf_counter()
    swapped = replace_linear(ours)      # plans for this GPU, builds every bucket's kernel (cached), swaps in place
    return stock, ours, swapped, time.perf_counter() - start


def kernel_paths(ours: Any, ms: list[int]) -> dict[str, dict[int, str]]:
    """{'(N, K)': {M: the kernel and path an eager call of M rows takes}} for each distinct Linear shape."""
    from generator.nn import Linear

    paths: dict[str, dict[int, str]] = {}
    for module in ours.modules():
        key = f"({module.out_features}, {module.in_features})" if isinstance(module, Linear) else None
        if key is None or key in paths:
            continue
        x = {m: torch.empty(m, module.in_features, device=module.weight.device, dtype=module.weight.dtype) for m in ms}
        try:
            paths[key] = {m: module.op.path(x[m], module.weight.t()) for m in ms}
        except Exception as err:  # only informative: never stop the run for it
            paths[key] = {m: f"(op.path failed: {type(err).__name__}: {err})" for m in ms}
    return paths


def make_static_cache(model: Any, max_cache_len: int) -> Any:
    """An empty StaticCache (transformers 5: config and max_cache_len; 4.x also wanted batch, device, dtype)."""
    from transformers import StaticCache

    try:
        return StaticCache(config=model.config, max_cache_len=max_cache_len)
    except TypeError:
        raise RuntimeError("this transformers' StaticCache(config=, max_cache_len=) failed; the script is written "
                           "for transformers 5 (StaticCache sized on its first update)") from None


def cache_lengths(cache: Any) -> list[torch.Tensor]:
    """The per-layer length tensors of a transformers 5 StaticCache (each layer's write position)."""
    lengths = [getattr(layer, "cumulative_length", None) for layer in getattr(cache, "layers", [])]
    if not lengths or not all(torch.is_tensor(t) for t in lengths):
        raise RuntimeError("this transformers' StaticCache keeps no per-layer cumulative_length tensors: the decode "
                           "step cannot rewind it (the script is written for transformers 5)")
    return lengths


def filled_cache(model: Any, prompt: torch.Tensor, context: int) -> tuple[Any, Callable[[], None]]:
    """A StaticCache holding ``model``'s keys and values of ``prompt`` (prefilled eagerly, untimed), and a function
    that sets its length back to ``context`` (one _foreach_copy_: cheap, and the same for both models)."""
    cache = make_static_cache(model, context + 1)
    model(input_ids=prompt, past_key_values=cache, use_cache=True)
    lengths = cache_lengths(cache)
    sources = [torch.full_like(lengths[0], context)] * len(lengths)

    def rewind() -> None:
        torch._foreach_copy_(lengths, sources)

    try:
        rewind()
    except (RuntimeError, AttributeError):  # no _foreach_copy_ for these tensors: a copy per layer
        def rewind() -> None:
            for length, source in zip(lengths, sources):
                length.copy_(source)
    return cache, rewind


def prefill_case(args: argparse.Namespace, ids: torch.Tensor) -> Case:
    def make_step(which: str, model: Callable) -> Callable[[], torch.Tensor]:
        return lambda: model(input_ids=ids, use_cache=False).logits

    return Case(f"prefill {args.prefill_batch}x{args.prefill_len}", make_step)


def decode_case(batch: int, context: int, prompt: torch.Tensor, token: torch.Tensor, models: dict[str, Any]
                ) -> Case:
    """One-token decode at ``batch`` sequences; each model (by name) decodes on a cache it prefilled itself."""
    caches = {which: filled_cache(model, prompt, context) for which, model in models.items()}

    def make_step(which: str, model: Callable) -> Callable[[], torch.Tensor]:
        cache, rewind = caches[which]

        def step() -> torch.Tensor:
            rewind()
            return model(input_ids=token, past_key_values=cache, use_cache=True).logits

        return step

    return Case(f"decode b{batch}", make_step)


def compiled(model: Any, mode: str) -> Callable:
    """``model`` under torch.compile; dynamic=False: one static graph per shape (decode b1 and b8 each get theirs)."""
    return torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)


def counter_totals() -> dict[str, int]:
    """Dynamo's graph-break count and inductor's CUDA-graph skips so far (to tell a row that its mode fell short)."""
    from torch._dynamo.utils import counters

    return {"graph breaks": sum(counters["graph_break"].values()),
            "cudagraph skips": counters["inductor"].get("cudagraph_skips", 0)}


def run_row(case: Case, mode: str, models: dict[str, Any], rounds: int) -> Row:
    from bench import timed_rounds, warm_up_gpu

    row = Row(case.name, mode if mode == "eager" else f"compile {mode}")
    before = counter_totals()
    steps, outputs = {}, {}
    for which in ("stock", "ours"):
        fn = models[which] if mode == "eager" else compiled(models[which], mode)
        step = case.make_step(which, fn)
        if mode == "reduce-overhead":
            step = with_step_begin(step)
        steps[which] = step
        start = time.perf_counter()
        for _ in range(1 if mode == "eager" else 3):   # compiled: compile, then (reduce-overhead) record, replay
            out = step()
        outputs[which] = out.float().clone()            # a CUDA graph's output is overwritten by its next replay
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        if mode != "eager":
            row.compile_s[which] = round(time.perf_counter() - start, 1)
    row.notes = [f"{n} {name}" for name, n in ((k, v - before[k]) for k, v in counter_totals().items()) if n]
    if mode == "eager" and case.stock_eager is None:
        case.stock_eager = outputs["stock"]
    row.ours_vs_stock = rel_diff(outputs["ours"], case.stock_eager)
    row.stock_vs_fp32 = rel_diff(outputs["stock"], case.reference)
    row.ours_vs_fp32 = rel_diff(outputs["ours"], case.reference)
    stock_error = rel_diff(case.stock_eager, case.reference)
    row.ok = row.ours_vs_stock <= REL_BOUND or row.ours_vs_fp32 <= ACCURACY_RATIO * stock_error
    warm_up_gpu(1.0)                                     # the GPU idled while compiling: ramp the clocks back up
    ms = timed_rounds(steps, rounds)
    row.stock_ms, row.ours_ms = ms["stock"], ms["ours"]
    row.speedup = row.stock_ms / row.ours_ms
    return row


def train_step(model: Any, ids: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One eager training step of ``model`` on the token ids ``ids`` (also its labels): zeroed gradients, forward with
    transformers' shifted cross-entropy, backward; returns the loss."""
    def step() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach()
    return step


def train_row(args: argparse.Namespace, models: dict[str, Any], gen: torch.Generator, rounds: int) -> Row:
    """One eager training step per model: zeroed gradients, forward with the tokens as labels (transformers' shifted
    cross-entropy), backward. Checked on the weight gradients of every Linear (ours: dX and dW on generated kernels):
    each model's against an fp32 copy's (the same bf16 weights upcast), ours' error at most ACCURACY_RATIO times the
    stock model's or within REL_BOUND of stock, over all gradients together."""
    from bench import timed_rounds, warm_up_gpu

    ids = torch.randint(0, args.vocab, (args.train_batch, args.train_len), device=DEVICE, generator=gen)

    def make_step(model: Any) -> Callable[[], torch.Tensor]:
        return train_step(model, ids)

    def linear_grads(model: Any) -> torch.Tensor:
        return torch.cat([p.grad.float().flatten() for name, p in model.named_parameters()
                          if name.endswith("proj.weight") or name == "lm_head.weight"])

    row = Row(f"train step {args.train_batch}x{args.train_len}", "eager")
    grads = {}
    reference = copy.deepcopy(models["stock"]).float()
    for which, model in (("fp32", reference), *models.items()):
        make_step(model)()
        grads[which] = linear_grads(model)
    del reference
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    row.ours_vs_stock = rel_diff(grads["ours"], grads["stock"])
    row.stock_vs_fp32, row.ours_vs_fp32 = (rel_diff(grads[w], grads["fp32"]) for w in ("stock", "ours"))
    row.ok = row.ours_vs_stock <= REL_BOUND or row.ours_vs_fp32 <= ACCURACY_RATIO * row.stock_vs_fp32
    row.notes = ["compared: the Linear layers' weight gradients"]
    del grads
    warm_up_gpu(1.0)
    ms = timed_rounds({which: make_step(model) for which, model in models.items()}, rounds)
    row.stock_ms, row.ours_ms = ms["stock"], ms["ours"]
    row.speedup = row.stock_ms / row.ours_ms
    return row


def with_step_begin(step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """Each call a new CUDA-graph step: the previous replay's outputs are dead, its graph may run again."""
    def wrapped() -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return step()

    return wrapped


def format_row(r: Row) -> str:
    head = f"{r.case:<16} {r.mode:<24}"
    if r.skipped:
        return f"{head} skipped: {r.skipped}"
    notes = list(r.notes)
    if r.compile_s:
        notes.append("first calls " + ", ".join(f"{k} {v:.0f} s" for k, v in r.compile_s.items()))
    return (f"{head} {r.stock_ms:9.3f} {r.ours_ms:9.3f} {r.speedup:9.3f}x  {r.ours_vs_stock:9.1e}  "
            f"{r.stock_vs_fp32:.1e} / {r.ours_vs_fp32:.1e}  {'ok' if r.ok else 'FAILED'}  {'; '.join(notes)}")


TABLE_HEAD = (f"{'case':<16} {'mode':<24} {'stock ms':>9} {'ours ms':>9} {'stock/ours':>10}  {'ours-stock':>9}  "
              "vs fp32: stock / ours")


def write_json(path: Path, meta: dict[str, Any], rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")


def modes_for(case: Case, args: argparse.Namespace) -> list[str]:
    modes = ["eager"] + ([] if args.no_compile else ["default"])
    if case.name.startswith("decode") and not (args.no_compile or args.no_reduce_overhead):
        modes.append("reduce-overhead")
    return modes


def make_cases(args: argparse.Namespace, stock: Any, ours: Any, gen: torch.Generator) -> list[Case]:
    """The prefill case and a decode case per batch size, each with its fp32 reference logits: those of an fp32
    copy of the stock model (its bf16 weights upcast, so the same function in exact-er arithmetic), freed here."""
    ids = torch.randint(0, args.vocab, (args.prefill_batch, args.prefill_len), device=DEVICE, generator=gen)
    cases = [prefill_case(args, ids)]
    reference = copy.deepcopy(stock).float()
    for batch in args.decode_batches:
        prompt = torch.randint(0, args.vocab, (batch, args.decode_context), device=DEVICE, generator=gen)
        token = torch.randint(0, args.vocab, (batch, 1), device=DEVICE, generator=gen)
        cases.append(decode_case(batch, args.decode_context, prompt, token,
                                 {"stock": stock, "ours": ours, "fp32": reference}))
    for case in cases:
        case.reference = case.make_step("fp32", reference)().float().clone()
    del reference                       # the decode cases keep its (small) caches, not its weights
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return cases


def raise_recompile_limit(at_least: int = 64) -> None:
    """Let dynamo keep ``at_least`` graphs per code object (its default, 8, is one model's forward compiled for a few
    shapes and modes; two models of one class share the count)."""
    import torch._dynamo.config as dynamo_config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(at_least, getattr(dynamo_config, name)))


def run_on_gpu(args: argparse.Namespace) -> int:
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # bench.py's timing helpers; generator from a checkout
    import transformers

    from bench import warm_up_gpu

    # Ten graphs of one forward (stock and ours, per case and mode) exceed dynamo's default of 8 per code object.
    raise_recompile_limit()

    device = torch.cuda.get_device_name()
    print(f"{describe(args)} on {device}; torch {torch.__version__}, transformers {transformers.__version__}",
          flush=True)
    stock, ours, swapped, build_s = build_models(args)
    ms = sorted({args.prefill_batch * args.prefill_len, *args.decode_batches})
    paths = kernel_paths(ours, ms)
    print(f"replace_linear swapped {swapped} nn.Linear layers ({len(paths)} distinct shapes) in {build_s:.1f} s; "
          "the kernel an eager call of M rows takes, per (out_features, in_features):")
    for shape, by_m in paths.items():
        print(f"  {shape}: " + "; ".join(f"M={m}: {p}" for m, p in by_m.items()))
    meta = {"config": llama_config_kwargs(args), "parameters": parameter_count(args), "device": device,
            "torch": torch.__version__, "transformers": transformers.__version__, "swapped": swapped,
            "build_s": round(build_s, 1), "kernel_paths": paths, "rounds": args.rounds,
            "decode_context": args.decode_context, "rel_bound": REL_BOUND, "accuracy_ratio": ACCURACY_RATIO}

    gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
    rows: list[Row] = []
    with torch.no_grad():
        cases = make_cases(args, stock, ours, gen)
        warm_up_gpu()
        print(f"\n{TABLE_HEAD}", flush=True)
        for case in cases:
            for mode in modes_for(case, args):
                try:
                    row = run_row(case, mode, {"stock": stock, "ours": ours}, args.rounds)
                except Exception as err:  # a compile mode that fails here is reported, not fatal
                    if mode == "eager":
                        raise
                    first_line = (str(err).strip().splitlines() or [""])[0][:300]
                    row = Row(case.name, f"compile {mode}", skipped=f"{type(err).__name__}: {first_line}")
                rows.append(row)
                print(format_row(row), flush=True)
                write_json(args.json, meta, rows)
    if args.train_batch:
        rows.append(train_row(args, {"stock": stock, "ours": ours}, gen, args.rounds))
        print(format_row(rows[-1]), flush=True)
        write_json(args.json, meta, rows)
    return summarize(rows, args.json)


def summarize(rows: list[Row], json_path: Path) -> int:
    timed = [r for r in rows if not r.skipped]
    failed = [r for r in timed if not r.ok]
    slow = [f"{r.case} {r.mode} {r.speedup:.3f}x" for r in timed if r.speedup < 1.0]
    if timed:
        worst = min(timed, key=lambda r: r.speedup)
        print(f"\nlowest stock/ours: {worst.speedup:.3f}x ({worst.case}, {worst.mode}); "
              f"{'every row >= 1.00x' if not slow else 'below 1.00x: ' + ', '.join(slow)}")
    print(f"correctness: {len(timed) - len(failed)} of {len(timed)} rows within {REL_BOUND:.0e} of stock or at most "
          f"{ACCURACY_RATIO:g}x its error against fp32" + ("" if not failed else " — FAILED: " +
          ", ".join(f"{r.case} {r.mode}" for r in failed)))
    print(f"wrote {json_path}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reasons = skip_reasons()
    if reasons:
        print(f"llama_linear: skipped building and timing the {describe(args)} with every nn.Linear on generated "
              f"kernels (prefill and decode, eager and torch.compile) — {'; '.join(reasons)}")
        return 0
    return run_on_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
