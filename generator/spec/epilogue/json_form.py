"""The JSON form of an ``Epilogue`` (what an emitted package's plans.json records of a function epilogue):
``epilogue_to_json`` and ``epilogue_from_json``, which checks every part."""
from __future__ import annotations

import json
from typing import Any

from .description import Epilogue
from .errors import EpilogueError
from .expr import _ARITY, OPS, Expr, _walk
from .operands import Operand


_JSON_KEYS = ("operands", "nodes", "D", "aux")
_OPERAND_KEYS = ("name", "kind", "dtype", "order")


def epilogue_to_json(ep: Epilogue) -> dict[str, Any]:
    """The description as JSON-compatible data (what an emitted package's plans.json records of a function
    epilogue): ``{"operands": [{"name", "kind", "dtype", "order"}, ...], "nodes": [...], "D": i, "aux": j}``.

    ``nodes`` lists every distinct node once, children before parents: ``{"op": "acc"}``, ``{"op": "operand",
    "name": n}``, ``{"op": "const", "value": x}`` or ``{"op": op, "args": [indices of earlier nodes]}``; ``D``
    and ``aux`` (None without a second output) are indices into it. Deterministic; ``epilogue_from_json``
    rebuilds an equal Epilogue (same canonical text, digest and kernel name)."""
    index: dict[Expr, int] = {}
    nodes: list[dict[str, Any]] = []
    for node in _walk(ep.result, ep.aux):
        if node in index:   # structurally equal to a node already listed
            continue
        entry: dict[str, Any] = {"op": node.op}
        if node.op == "operand":
            entry["name"] = node.name
        elif node.op == "const":
            entry["value"] = node.value
        elif node.args:
            entry["args"] = [index[a] for a in node.args]
        index[node] = len(nodes)
        nodes.append(entry)
    operands = [{"name": o.name, "kind": o.kind, "dtype": o.dtype.value if o.dtype is not None else None,
                 "order": o.order.value if o.order is not None else None} for o in ep.operands]
    return {"operands": operands, "nodes": nodes, "D": index[ep.result],
            "aux": index[ep.aux] if ep.aux is not None else None}


def _json_index(value: object, what: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise EpilogueError(f"epilogue JSON: {what} is {value!r}, not the index of an earlier node (0 to {limit - 1})")
    return value


def _json_object(value: object, what: str, keys: tuple[str, ...], required: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EpilogueError(f"epilogue JSON: {what} is {type(value).__name__}, not an object")
    unknown = sorted(set(value) - set(keys), key=str)
    missing = [k for k in required if k not in value]
    if unknown or missing:
        problem = f"unknown key(s) {', '.join(map(repr, unknown))}" if unknown else f"no {', '.join(missing)}"
        raise EpilogueError(f"epilogue JSON: {what} has {problem} (keys: {', '.join(keys)})")
    return value


def epilogue_from_json(data: object) -> Epilogue:
    """The Epilogue that ``epilogue_to_json`` described (a dict, or its JSON text); every part is checked, and a
    bad one raises EpilogueError saying which."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as err:
            raise EpilogueError(f"epilogue JSON: not valid JSON ({err})") from None
    obj = _json_object(data, "the epilogue", _JSON_KEYS, _JSON_KEYS)
    raw_operands, raw_nodes = obj["operands"], obj["nodes"]
    if not isinstance(raw_operands, list) or not isinstance(raw_nodes, list) or not raw_nodes:
        raise EpilogueError("epilogue JSON: 'operands' must be a list and 'nodes' a non-empty list")
    operands = []
    for i, raw in enumerate(raw_operands):
        o = _json_object(raw, f"operand {i}", _OPERAND_KEYS, ("name", "kind"))
        operands.append(Operand(o["name"], o["kind"], o.get("dtype"), o.get("order")))
    nodes: list[Expr] = []
    for i, raw in enumerate(raw_nodes):
        n = _json_object(raw, f"node {i}", ("op", "args", "value", "name"), ("op",))
        if not isinstance(n["op"], str) or n["op"] not in _ARITY:
            raise EpilogueError(f"epilogue JSON: node {i} has op {n['op']!r}; known: {', '.join(OPS)}")
        args = n.get("args", [])
        if not isinstance(args, list):
            raise EpilogueError(f"epilogue JSON: node {i}'s args must be a list of node indices")
        value = n.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise EpilogueError(f"epilogue JSON: node {i}'s value {value!r} is not a number")
        nodes.append(Expr(n["op"], tuple(nodes[_json_index(a, f"an argument of node {i}", i)] for a in args),
                          value=value, name=n.get("name")))
    result = nodes[_json_index(obj["D"], "D", len(nodes))]
    aux = nodes[_json_index(obj["aux"], "aux", len(nodes))] if obj["aux"] is not None else None
    return Epilogue(tuple(operands), result, aux)
