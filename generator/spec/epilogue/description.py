"""The description itself: the frozen, hashable ``Epilogue`` (operands and the expression of D and aux), the
checks every construction runs, its names and texts (canonical, digest, tag, formula), ``IDENTITY``, and
the fp8 scales (SCALE_MODES, SCALE_NAMES, ``with_scales``), which ``Epilogue.scale_mode`` and ``tag``
recognise, so they live here with it."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Iterator

from ..types import OUTPUT_DTYPES, DType, parse_dtype
from .errors import EpilogueError
from .expr import (_KINKED, _MAX_TREE_NODES, ACC, Expr, _affine_in_acc, _infix, _sexpr, _tree_nodes, _uses,
                   _walk)
from .operands import _KINDS, KINDS, MAINLOOP_KINDS, Operand


# Token of each function op in kernel names; arithmetic is left out (the operands say most of it).
_TAG_TOKENS = {"relu": "relu", "leaky_relu": "lrelu", "gelu": "gelu", "gelu_tanh": "gelutanh", "silu": "silu",
               "sigmoid": "sigmoid", "tanh": "tanh", "clamp": "clamp", "clamp_min": "clamp", "clamp_max": "clamp",
               "max": "max", "min": "min", "abs": "abs"}
_TAG_MAX = 40


#: The activations of ``Epilogue.bias_activation``: those whose derivative torch computes as one kernel.
BIAS_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")


@dataclass(frozen=True)
class BiasActivation:
    """A Linear layer's epilogue, D = activation(acc + bias): the activation (one of BIAS_ACTIVATIONS) or None, the
    per-column operand's name or None."""

    activation: str | None
    bias: str | None


@dataclass(frozen=True)
class Epilogue:
    """D = result(acc, operands), and optionally a second M x N output ``aux`` (same dtype and order as D).

    ``operands`` are in the op's positional order (after A and B). Equal descriptions are equal and hash
    alike however they were written (knobs or function)."""

    operands: tuple[Operand, ...]
    result: Expr
    aux: Expr | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "operands", tuple(self.operands))
        for problem in _problems(self):
            raise EpilogueError(problem)

    # -- queries ------------------------------------------------------------------------------------

    @property
    def is_identity(self) -> bool:
        return self == IDENTITY

    def operand(self, name: str) -> Operand:
        for op in self.operands:
            if op.name == name:
                return op
        raise KeyError(f"no operand {name!r}; operands: {', '.join(o.name for o in self.operands) or 'none'}")

    def operands_of_kind(self, kind: str) -> tuple[Operand, ...]:
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        return tuple(op for op in self.operands if op.kind == kind)

    def nodes(self) -> tuple[Expr, ...]:
        """Distinct non-leaf nodes of D then aux, children first (each once even if shared): one C++
        temporary each, in this order."""
        seen: dict[Expr, None] = {}
        for node in _walk(self.result, self.aux):
            if not node.is_leaf:
                seen.setdefault(node)
        return tuple(seen)

    @property
    def backward_reads_acc(self) -> bool:
        """Whether the gradients of D (and aux) need acc's value: False when each is c * acc plus terms without
        acc, c made of constants and scalars only (``acc + bias``, ``alpha * acc + beta * C``): the gradient
        with respect to acc is then c times D's, and no operand's gradient reads acc."""
        scalars = {op.name for op in self.operands if op.kind == "scalar"}
        return not all(_affine_in_acc(root, scalars) for root in (self.result, self.aux) if root is not None)

    @property
    def smooth_in_acc(self) -> bool:
        """Whether D and aux have continuous derivatives in acc: no relu, leaky_relu, abs, max, min or clamp of
        an expression that reads acc. Their gradients may then be taken at acc rounded to D's dtype (an error of
        that rounding's size); at a kink the rounding would flip the derivative of the elements next to it."""
        return not any(n.op in _KINKED and any(a.op == "acc" for a in _walk(n))
                       for n in _walk(self.result, self.aux))

    @property
    def bias_activation(self) -> BiasActivation | None:
        """This epilogue as a Linear layer's, ``activation(acc + bias)`` with either part optional (one per-column
        operand, nothing else, no aux), else None: its backward has a closed form (runtime/autograd.py)."""
        if self.aux is not None:
            return None
        node, activation, bias = self.result, None, None
        if node.op in BIAS_ACTIVATIONS:
            activation, node = node.op, node.args[0]
        if node.op == "add":
            left, right = node.args
            summand = right if left.op == "acc" else left if right.op == "acc" else None
            if summand is None or summand.op != "operand":
                return None
            bias, node = summand.name, ACC
        if node.op != "acc" or (activation is None and bias is None):
            return None
        expected = () if bias is None else (bias,)
        if tuple(op.name for op in self.operands) != expected or any(op.kind != "col" for op in self.operands):
            return None
        return BiasActivation(activation, bias)

    def resolved(self, out_dtype: DType | str) -> Epilogue:
        """Operands whose dtype is None ("like the output") get ``out_dtype``."""
        dtype = parse_dtype(out_dtype, what="out_dtype", allowed=(*OUTPUT_DTYPES, DType.int32))
        if all(op.dtype is not None for op in self.operands):
            return self
        if dtype not in OUTPUT_DTYPES:
            raise EpilogueError(f"out_dtype={dtype.value!r} (int8's exact sums) takes no epilogue operand of the "
                                "output's dtype: give the operands a dtype, or plan out_dtype='fp32' or 'bf16'")
        return replace(self, operands=tuple(op if op.dtype is not None else replace(op, dtype=dtype)
                                            for op in self.operands))

    # -- names and text -----------------------------------------------------------------------------

    @property
    def canonical(self) -> str:
        """Deterministic serialization (no hash seed, no ids):
        ``(epilogue (operands (bias col out -) ...) (D <sexpr>) (aux <sexpr>|none))``."""
        ops = " ".join(f"({o.name} {o.kind} {o.dtype.value if o.dtype else 'out'} "
                       f"{o.order.value if o.order else '-'})" for o in self.operands)
        aux = _sexpr(self.aux) if self.aux is not None else "none"
        return f"(epilogue (operands{' ' + ops if ops else ''}) (D {_sexpr(self.result)}) (aux {aux}))"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical.encode()).hexdigest()[:8]

    @property
    def scale_mode(self) -> str:
        """The fp8 scale mode (SCALE_MODES) that ``with_scales`` gave this epilogue, "none" if it gave none:
        recognised from the leading operands scale_a and scale_b, their kinds and the expression."""
        split = _unscaled(self)
        return split[0] if split is not None else "none"

    @property
    def tag(self) -> str:
        """Readable kernel-name token: ``scale_<mode>`` for a scaled epilogue, then the functions used, the
        operands (kind letter + name) and 'aux' of the epilogue without its scales."""
        split = _unscaled(self)
        if split is not None:
            mode, base = split
            tokens = [f"scale_{mode}"] + ([] if base.is_identity else [base.tag])
            return "_".join(tokens)[:_TAG_MAX].rstrip("_")
        if self.is_identity:
            return "identity"
        tokens = list(dict.fromkeys(_TAG_TOKENS[n.op] for n in self.nodes() if n.op in _TAG_TOKENS))
        tokens += [_KINDS[o.kind].tag + o.name for o in self.operands]
        tokens += ["aux"] if self.aux is not None else []
        return ("_".join(tokens) or "expr")[:_TAG_MAX].rstrip("_")

    @property
    def name_suffix(self) -> str:
        return "" if self.is_identity else f"_ep_{self.tag}_{self.digest}"

    @property
    def text(self) -> str:
        """Readable infix formula, e.g. ``silu(alpha * acc + bias) + beta * C``."""
        d = _infix(self.result)[0]
        return d if self.aux is None else f"D = {d}, aux = {_infix(self.aux)[0]}"

    def describe(self) -> list[str]:
        lines = [f"D = {_infix(self.result)[0]}"]
        if self.aux is not None:
            lines.append(f"aux = {_infix(self.aux)[0]}  (second output, M x N, dtype and order of D)")
        return lines + [op.describe() for op in self.operands]

    def __str__(self) -> str:
        return self.text


def _problems(ep: Epilogue) -> Iterator[str]:
    """What makes a description unusable (checked on every construction, whoever builds it)."""
    if not all(isinstance(op, Operand) for op in ep.operands):
        yield "operands must be Operand objects"
        return
    names = [op.name for op in ep.operands]
    if len(set(names)) != len(names):
        yield f"operand names repeat: {', '.join(names)}"
    for label, root in (("D", ep.result), ("aux", ep.aux)):
        if root is None:
            continue
        if not isinstance(root, Expr):
            yield f"{label} must be an Expr, not {type(root).__name__}"
            return
        if _tree_nodes(root) > _MAX_TREE_NODES:
            yield (f"the expression of {label} is too large ({_tree_nodes(root)} nodes counting repeats; "
                   f"at most {_MAX_TREE_NODES})")
            return
        reads_acc, used = _uses(root)
        if not reads_acc:
            yield f"{label} does not use the accumulator: it would not depend on A @ B"
        if used - set(names):
            yield f"{label} reads undeclared operand(s) {', '.join(sorted(used - set(names)))}"
    if ep.aux is not None and ep.aux == ep.result:
        yield "aux is the same expression as D: return D alone"
    used = _uses(ep.result)[1] | (_uses(ep.aux)[1] if ep.aux is not None else set())
    for op in ep.operands:
        if op.kind in MAINLOOP_KINDS and op.name in used:
            yield (f"operand {op.name!r} holds per-block scales ({op.kind}), which the kernel's main loop applies to "
                   f"each K block of acc; the expression cannot read them: remove {op.name} from the expression")
        elif op.kind not in MAINLOOP_KINDS and op.name not in used:
            yield f"operand {op.name!r} is not used: remove it, or the op would require it for nothing"
    # The main loop applies one scale of A and one of B per K block: exactly one of each, or none.
    counts = [sum(op.kind == kind for op in ep.operands) for kind in MAINLOOP_KINDS]
    if counts not in ([0, 0], [1, 1]):
        yield (f"per-block scales come as one pair, a row_blocks operand (A's) and a col_blocks operand (B's); "
               f"this epilogue has {counts[0]} and {counts[1]}: build it with with_scales(epilogue, 'block')")


IDENTITY = Epilogue((), ACC)

# -- fp8 scales -------------------------------------------------------------------------------------

#: How an fp8 GEMM's scales (D = epilogue((A @ B) * scale_a * scale_b)) are given; see ``with_scales``.
SCALE_MODES = ("none", "tensor", "row", "block")
#: The operands of the scales of A and B, first among a scaled epilogue's operands.
SCALE_NAMES = ("scale_a", "scale_b")
#: mode -> the operands scale_a (of A) and scale_b (of B) that ``with_scales`` puts first, all fp32.
_SCALE_OPERANDS = {
    "tensor": (Operand("scale_a", "scalar_tensor"), Operand("scale_b", "scalar_tensor")),
    "row": (Operand("scale_a", "row", DType.fp32), Operand("scale_b", "col", DType.fp32)),
    "block": (Operand("scale_a", "row_blocks"), Operand("scale_b", "col_blocks")),
}
#: What each acc of the expression becomes where the epilogue applies the scales (not where the main loop
#: does): one node, so that the functor computes it once per element.
_SCALED_ACC = Expr("mul", (Expr("mul", (ACC, Expr("operand", name="scale_a"))), Expr("operand", name="scale_b")))


def _substitute(root: Expr | None, old: Expr, new: Expr) -> Expr | None:
    """``root`` with every node equal to ``old`` replaced by ``new`` (children first, without recursion)."""
    if root is None:
        return None
    done: dict[int, Expr] = {}
    for node in _walk(root):
        if node == old:
            done[id(node)] = new
        elif node.args:
            done[id(node)] = Expr(node.op, tuple(done[id(a)] for a in node.args), node.value, node.name)
        else:
            done[id(node)] = node
    return done[id(root)]


def _in_main_loop(mode: str) -> bool:
    return all(op.kind in MAINLOOP_KINDS for op in _SCALE_OPERANDS[mode])


def with_scales(ep: Epilogue, mode: str) -> Epilogue:
    """``ep`` for an fp8 GEMM with scales, D = ep((A @ B) * scale_a * scale_b), by scale mode:

    * ``"none"``: ep itself;
    * ``"tensor"``: scale_a and scale_b are one-element fp32 tensors (``ScalarTensor``), read on the device;
    * ``"row"``: scale_a one fp32 value per row of A (a Row), scale_b one per column of B (a Col);
    * ``"block"``: scale_a per row of A and 128-wide K block, (M, ceil(K/128)); scale_b per 128 x 128 block of
      B, (ceil(N/128), ceil(K/128)); the kernel's main loop applies them, the expression stays as it is.

    The two operands come first (the op takes A, B, scale_a, scale_b, then ep's operands); for "tensor" and
    "row" every acc of D and aux becomes ``acc * scale_a * scale_b``."""
    if mode not in SCALE_MODES:
        raise EpilogueError(f"scale mode {mode!r} is not one of {', '.join(map(repr, SCALE_MODES))}")
    if mode == "none":
        return ep
    names = {op.name for op in ep.operands}
    taken = [op.name for op in _SCALE_OPERANDS[mode] if op.name in names]
    if taken and ep.scale_mode != "none":
        raise EpilogueError(f"the epilogue is already scaled (scale mode {ep.scale_mode!r}): apply with_scales "
                            "once, to the epilogue without scales")
    if taken:
        raise EpilogueError(f"the epilogue has an operand named {taken[0]!r}, which the scales of A and B take "
                            "(scale_a, scale_b): rename the epilogue's operand")
    operands = _SCALE_OPERANDS[mode] + ep.operands
    if _in_main_loop(mode):
        return Epilogue(operands, ep.result, ep.aux)
    return Epilogue(operands, _substitute(ep.result, ACC, _SCALED_ACC), _substitute(ep.aux, ACC, _SCALED_ACC))


def _unscaled(ep: Epilogue) -> tuple[str, Epilogue] | None:
    """(scale mode, the epilogue without its scales) of an epilogue that ``with_scales`` made, else None."""
    for mode, scales in _SCALE_OPERANDS.items():
        if ep.operands[:2] != scales:
            continue
        result, aux = ep.result, ep.aux
        if not _in_main_loop(mode):
            result, aux = _substitute(result, _SCALED_ACC, ACC), _substitute(aux, _SCALED_ACC, ACC)
        try:
            base = Epilogue(ep.operands[2:], result, aux)
        except EpilogueError:   # scale_a or scale_b read elsewhere too: not with_scales' doing
            return None
        return (mode, base) if with_scales(base, mode) == ep else None
    return None
