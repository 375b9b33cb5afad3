"""A bring-your-own-codegen backend written OUTSIDE kiln, using only public hooks.

Target kind "jsongraph": graph-level functions are NOT lowered (the kind's
"graph_pipeline" attribute keeps operator calls); the codegen serialises each
graph function to JSON (plus the weights as one binary artifact), both with
the loader "jsongraph"; the loader interprets the JSON with numpy.

    import jsongraph_backend
    jsongraph_backend.register()
    ex = kiln.compile(mod, "jsongraph")

`register` is also this package's `kiln.backends` entry point.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from kiln.artifact import Artifact
from kiln.codegen import graph_signature, register_codegen
from kiln.errors import CompileError, KilnError
from kiln.ir import IRModule
from kiln.ir import graph as g
from kiln.runtime import FunctionTableModule, LoadContext, PackedFunction, register_loader
from kiln.target import TargetKind, list_kinds, register_kind

NAME = "jsongraph"
GRAPH_FILE = "graph.json"
WEIGHTS_FILE = "weights.bin"

# The operators this "accelerator" runs, as numpy functions of (args, attrs).
OPS: dict[str, Any] = {
    "add": lambda a, attrs: a[0] + a[1],
    "multiply": lambda a, attrs: a[0] * a[1],
    "relu": lambda a, attrs: np.maximum(a[0], 0),
    "tanh": lambda a, attrs: np.tanh(a[0]),
    "matmul": lambda a, attrs: a[0] @ a[1],
}


def register() -> None:
    """Register the target kind, the codegen and the loader (idempotent)."""
    if NAME in list_kinds():
        return
    kind = TargetKind(NAME, {}, (NAME,), doc="graphs as JSON, run by numpy")
    kind.set_attr("codegen", NAME)
    # Opt out of lowering: keep operator calls for the JSON graph.
    kind.set_attr("graph_pipeline", "dead-code-elimination")
    kind.set_attr("tensor_pipeline", "none")
    register_kind(kind)
    register_codegen(NAME, codegen_jsongraph, override=True)
    register_loader(NAME, load_jsongraph, override=True)


# ----------------------------------------------------------------- codegen

def codegen_jsongraph(mod: IRModule, target: Any, *, prefix: str, pool: Any) -> list[Artifact]:
    if mod.prim_funcs():
        raise CompileError(f"jsongraph runs operator graphs only; the module has tensor-level "
                           f"functions {sorted(mod.prim_funcs())}")
    weights = bytearray()
    functions = {}
    for name, fn in mod.graph_funcs().items():
        functions[name] = {"signature": graph_signature(name, fn, prefix),
                           "graph": _serialise(name, fn, weights)}
    doc = {"format": "jsongraph", "version": 1, "functions": functions}
    graph = json.dumps(doc, indent=1, sort_keys=True).encode()
    return [Artifact(NAME, NAME, GRAPH_FILE, graph, {"functions": sorted(functions)}),
            Artifact(NAME, NAME, WEIGHTS_FILE, bytes(weights), {"align": 16})]


def _serialise(fname: str, fn: g.Function, weights: bytearray) -> dict[str, Any]:
    names: dict[g.Var, str] = {}
    consts: dict[g.Constant, dict[str, Any]] = {}

    def ref(e: g.Expr) -> Any:
        if isinstance(e, g.Var):
            return {"var": names[e]}
        if isinstance(e, g.Constant):
            if e not in consts:
                offset = -(-len(weights) // 16) * 16
                weights.extend(b"\0" * (offset - len(weights)))
                weights.extend(e.data.tobytes())
                consts[e] = {"const": {"offset": offset, "dtype": e.data.dtype.name,
                                       "shape": list(e.data.shape)}}
            return consts[e]
        if isinstance(e, g.Tuple):
            return {"tuple": [ref(f) for f in e.fields]}
        raise CompileError(f"jsongraph: {fname}: cannot serialise {type(e).__name__}")

    for i, p in enumerate(fn.params):
        names[p] = f"p{i}"
    nodes = []
    for k, b in enumerate(fn.bindings):
        value = b.value
        if not isinstance(value, g.Call) or value.op not in OPS:
            what = value.op if isinstance(value, g.Call) else type(value).__name__
            raise CompileError(f"jsongraph: {fname}: unsupported node {what}; "
                               f"supported operators: {', '.join(sorted(OPS))}")
        names[b.var] = f"n{k}"
        nodes.append({"name": f"n{k}", "op": value.op, "args": [ref(a) for a in value.args],
                      "attrs": dict(value.attrs)})
    return {"params": [names[p] for p in fn.params], "nodes": nodes, "result": ref(fn.result)}


# ----------------------------------------------------------------- loader

class JsonGraphFunction(PackedFunction):
    """Interprets one serialised graph; argument checks and outputs come from PackedFunction."""

    def __init__(self, entry: dict[str, Any], weights: bytes) -> None:
        super().__init__(entry["signature"])
        self.graph = entry["graph"]
        self.weights = weights

    def _invoke(self, values: list[Any], wheres: list[Any]) -> None:
        from kiln.runtime.function import check_tensor

        arrays = [check_tensor(np.asarray(v), p, w)
                  for v, p, w in zip(values, self.params + self.results, wheres)]
        n = len(self.params)
        env: dict[str, Any] = dict(zip(self.graph["params"], arrays[:n]))
        for node in self.graph["nodes"]:
            args = [self._value(a, env) for a in node["args"]]
            env[node["name"]] = OPS[node["op"]](args, node["attrs"])
        result = self._value(self.graph["result"], env)
        results = result if isinstance(result, tuple) else (result,)
        for out, value in zip(arrays[n:], results):
            np.copyto(out, value, casting="same_kind")

    def _value(self, r: dict[str, Any], env: dict[str, Any]) -> Any:
        if "var" in r:
            return env[r["var"]]
        if "tuple" in r:
            return tuple(self._value(f, env) for f in r["tuple"])
        c = r["const"]
        count = int(np.prod(c["shape"], dtype=np.int64))
        return np.frombuffer(self.weights, c["dtype"], count, c["offset"]).reshape(c["shape"])


def load_jsongraph(artifacts: list[Any], ctx: LoadContext) -> FunctionTableModule:
    files = {a.file_name: a for a in artifacts}
    if GRAPH_FILE not in files:
        raise KilnError(f"jsongraph loader: no {GRAPH_FILE} among {sorted(files)}")
    doc = json.loads(files[GRAPH_FILE].content)
    if doc.get("format") != "jsongraph" or doc.get("version") != 1:
        raise KilnError(f"jsongraph loader: unsupported document {doc.get('format')!r} "
                        f"version {doc.get('version')!r}")
    weights = files[WEIGHTS_FILE].content if WEIGHTS_FILE in files else b""
    fns = {name: JsonGraphFunction(entry, weights) for name, entry in doc["functions"].items()}
    return FunctionTableModule(NAME, fns, metadata=dict(ctx.metadata), artifacts=artifacts)
