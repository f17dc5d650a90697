"""A corpus of GEMM shapes from real models' linear layers, forward and backward, at every token count a user runs.

Each model is described by the fields of its public configuration (``config.json`` on the Hugging Face hub) and
its linear layers are derived from them as the model's reference code (transformers) builds them: fused where that
code fuses (Phi-3's ``qkv_proj`` and ``gate_up_proj``, Falcon's ``query_key_value``), separate where it does not
(Llama's ``q_proj``, ``k_proj``, ``v_proj``). A layer is ``y = x @ W.t()`` with W (N, K): out features N, in features
K. The token count M runs over ``TOKENS``; a mixture of experts' expert layers are listed at the rows one expert
sees (routing skew is issue 35's corpus, not this one).

For each forward row (M, N, K) the backward pass of ``nn.Linear`` runs two more GEMMs, as autograd runs them:

* ``dX = dY @ W``: (M, N) @ (N, K), both row-major: the GEMM M x K x N (inner dimension N);
* ``dW = dY.t() @ X``: (N, M) @ (M, K), the first operand a transposed view: the GEMM N x K x M, whose inner
  dimension is the token count.

``rows()`` lists them; ``benchmarks/bench_corpus.py`` times them. Pure Python, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

#: Token counts (rows of the forward GEMM): decode (1-16), continuous batching and chunked prefill (24-1024),
#: prefill and training (1536-16384).
TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192,
          16384)
PASSES = ("fwd", "dX", "dW")
#: The M bands a summary is given for (inclusive bounds of the token count).
BANDS = ((1, 16), (17, 64), (65, 256), (257, 1024), (1025, 4096), (4097, 16384))


@dataclass(frozen=True)
class Layer:
    """One linear layer: out features ``n``, in features ``k`` (W is n x k)."""

    kind: str    # q, kv, qkv, o, mlp_up, mlp_gate_up, mlp_down, lm_head, expert_up, expert_down, ...
    n: int
    k: int


@dataclass(frozen=True)
class Model:
    name: str
    source: str            # the configuration the numbers are read from
    layers: tuple[Layer, ...]


def decoder(name: str, source: str, *, hidden: int, intermediate: int, heads: int, kv_heads: int,
            vocab: int, head_dim: int | None = None, fused_qkv: bool = False,
            fused_gate_up: bool = False) -> Model:
    """A Llama-style decoder's layers: attention projections, a gated MLP (gate and up of ``intermediate`` each,
    down back to ``hidden``), the vocabulary head."""
    head_dim = head_dim or hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    if fused_qkv:
        attention = [Layer("qkv", q + 2 * kv, hidden)]
    else:
        attention = [Layer("q", q, hidden), Layer("kv", kv, hidden)]   # k and v are the same GEMM
    mlp = ([Layer("mlp_gate_up", 2 * intermediate, hidden)] if fused_gate_up
           else [Layer("mlp_up", intermediate, hidden)])                # gate and up are the same GEMM
    layers = [*attention, Layer("o", hidden, q), *mlp, Layer("mlp_down", hidden, intermediate),
              Layer("lm_head", vocab, hidden)]
    return Model(name, source, tuple(layers))


def with_layers(model: Model, extra: Iterable[Layer], drop: Iterable[str] = ()) -> Model:
    """``model`` with the layer kinds in ``drop`` removed and ``extra`` added (experts, MLA's projections)."""
    dropped = set(drop)
    return Model(model.name, model.source, tuple(l for l in model.layers if l.kind not in dropped) + tuple(extra))


def models() -> tuple[Model, ...]:
    """The corpus' models, dense and mixture of experts (ten or more, per issue 34)."""
    return (
        decoder("llama3-8b", "meta-llama/Meta-Llama-3-8B", hidden=4096, intermediate=14336, heads=32, kv_heads=8,
                vocab=128256),
        decoder("llama3-70b", "meta-llama/Meta-Llama-3-70B", hidden=8192, intermediate=28672, heads=64, kv_heads=8,
                vocab=128256),
        decoder("llama3.2-1b", "meta-llama/Llama-3.2-1B", hidden=2048, intermediate=8192, heads=32, kv_heads=8,
                head_dim=64, vocab=128256),
        decoder("llama3.2-3b", "meta-llama/Llama-3.2-3B", hidden=3072, intermediate=8192, heads=24, kv_heads=8,
                head_dim=128, vocab=128256),
        decoder("qwen2.5-7b", "Qwen/Qwen2.5-7B", hidden=3584, intermediate=18944, heads=28, kv_heads=4, vocab=152064),
        decoder("qwen2.5-72b", "Qwen/Qwen2.5-72B", hidden=8192, intermediate=29568, heads=64, kv_heads=8,
                vocab=152064),
        decoder("phi3-mini", "microsoft/Phi-3-mini-4k-instruct", hidden=3072, intermediate=8192, heads=32,
                kv_heads=32, vocab=32064, fused_qkv=True, fused_gate_up=True),
        decoder("gemma2-9b", "google/gemma-2-9b", hidden=3584, intermediate=14336, heads=16, kv_heads=8,
                head_dim=256, vocab=256000),
        # Falcon: multi-query attention fused into one query_key_value (71 heads of 64 + one k and one v head), a
        # plain (ungated) MLP of 4 x hidden.
        Model("falcon-7b", "tiiuae/falcon-7b", (Layer("qkv", 4544 + 2 * 64, 4544), Layer("o", 4544, 4544),
                                                Layer("mlp_up", 18176, 4544), Layer("mlp_down", 4544, 18176),
                                                Layer("lm_head", 65024, 4544))),
        # Mixtral: Mistral's attention, eight experts of Mistral's MLP (w1/w3 up, w2 down), two per token.
        with_layers(decoder("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", hidden=4096, intermediate=14336,
                            heads=32, kv_heads=8, vocab=32000),
                    [Layer("expert_up", 14336, 4096), Layer("expert_down", 4096, 14336)],
                    drop=("mlp_up", "mlp_down")),
        # Qwen3 MoE: 128 experts of intermediate 768, eight per token; head_dim 128 over 32 query heads.
        with_layers(decoder("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", hidden=2048, intermediate=768, heads=32,
                            kv_heads=4, head_dim=128, vocab=151936),
                    [Layer("expert_up", 768, 2048), Layer("expert_down", 2048, 768)],
                    drop=("mlp_up", "mlp_down")),
        # DeepSeek-V2-Lite: multi-head latent attention (q_proj to 16 heads of 128 + 64 rope dims; kv compressed to
        # 512 + 64 rope dims, then expanded to 16 x (128 + 128)); 64 routed experts of 1408 and 2 shared ones (one
        # MLP of 2816); a dense first layer of 10944.
        Model("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite",
              (Layer("q", 16 * 192, 2048), Layer("kv_a", 512 + 64, 2048), Layer("kv_b", 16 * 256, 512),
               Layer("o", 2048, 16 * 128), Layer("expert_up", 1408, 2048), Layer("expert_down", 2048, 1408),
               Layer("shared_up", 2816, 2048), Layer("shared_down", 2048, 2816), Layer("mlp_up", 10944, 2048),
               Layer("mlp_down", 2048, 10944), Layer("lm_head", 102400, 2048))),
    )


@dataclass(frozen=True)
class CorpusRow:
    """One GEMM of the corpus: ``pass_`` of ``layer`` of ``model`` at ``tokens`` tokens; (m, n, k) the GEMM as
    torch runs it (D (m, n) = A (m, k) @ B (k, n))."""

    model: str
    layer: str
    pass_: str
    tokens: int
    m: int
    n: int
    k: int
    # The forward layer's weight: out features and in features.
    out_features: int
    in_features: int

    @property
    def gemm(self) -> tuple[str, int, int, int]:
        """What identifies the timing: the pass (its operand layouts) and the GEMM's size."""
        return (self.pass_, self.m, self.n, self.k)

    @property
    def flop(self) -> int:
        return 2 * self.m * self.n * self.k


def pass_shape(pass_: str, tokens: int, n: int, k: int) -> tuple[int, int, int]:
    """(m, n, k) of one pass of the layer y = x @ W.t() with W (n, k) at ``tokens`` rows (see the module
    docstring)."""
    if pass_ == "fwd":
        return tokens, n, k
    if pass_ == "dX":
        return tokens, k, n
    if pass_ == "dW":
        return n, k, tokens
    raise ValueError(f"pass {pass_!r}: one of {', '.join(PASSES)}")


def pass_product(pass_: str, X, W, dY):
    """torch's product for one pass of y = X @ W.t() (X tokens x k, W n x k, dY tokens x n), as autograd runs it:
    fwd X @ W.t(), dX dY @ W, dW dY.t() @ X (tensors of any dtype: the caller's)."""
    if pass_ == "fwd":
        return X @ W.t()
    if pass_ == "dX":
        return dY @ W
    if pass_ == "dW":
        return dY.t() @ X
    raise ValueError(f"pass {pass_!r}: one of {', '.join(PASSES)}")


def rows(model_names: Iterable[str] | None = None, tokens: Iterable[int] = TOKENS,
         passes: Iterable[str] = PASSES, max_gflop: float | None = None,
         layer_kinds: Iterable[str] | None = None) -> list[CorpusRow]:
    """The corpus' rows for the named models (all by default), token counts and passes, of the layer kinds named
    (all by default); ``max_gflop`` leaves out GEMMs of more work (to fit a time budget)."""
    kinds = None if layer_kinds is None else set(layer_kinds)
    chosen = models()
    if model_names is not None:
        wanted = list(model_names)
        known = {m.name for m in chosen}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise ValueError(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(sorted(known))}")
        chosen = tuple(m for m in chosen if m.name in wanted)
    passes = list(passes)
    for p in passes:
        if p not in PASSES:
            raise ValueError(f"pass {p!r}: one of {', '.join(PASSES)}")
    out = []
    for model in chosen:
        for layer in model.layers:
            if kinds is not None and layer.kind not in kinds:
                continue
            for t in tokens:
                for p in passes:
                    row = CorpusRow(model.name, layer.kind, p, t, *pass_shape(p, t, layer.n, layer.k), layer.n,
                                    layer.k)
                    if max_gflop is None or row.flop <= max_gflop * 1e9:
                        out.append(row)
    return out


def forward_shapes(model_names: Iterable[str] | None = None, tokens: Iterable[int] = TOKENS,
                   layer_kinds: Iterable[str] | None = None) -> list[tuple[int, int, int]]:
    """The distinct (m, n, k) of the forward rows (``rows``' filters), in corpus order."""
    return list(dict.fromkeys((r.m, r.n, r.k) for r in rows(model_names, tokens, ["fwd"], layer_kinds=layer_kinds)))


def band_of(tokens: int) -> str:
    """The label of the M band ``tokens`` falls in, e.g. "65-256"."""
    for lo, hi in BANDS:
        if lo <= tokens <= hi:
            return f"{lo}-{hi}"
    return f">{BANDS[-1][1]}"
