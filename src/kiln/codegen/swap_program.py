"""The swap program: a library's replay record as a table its C runs.

`{prefix}_swap_weights` (kiln_swap.c, docs/abi.md "Swapping weights") rebuilds the
constants from new raw weights without Python. This module turns the replay record
(docs/format.md, "The replay record") into the table it runs (docs/format.md, "The swap
program"): int64 words, each node with its result's dtype and shape worked out here, so
the C only allocates, moves and computes. It lives in its own object, `swap_program.c`
(`{prefix}_swap_program`, `{prefix}_swap_names`), added after the compile cache as the
record is: it names the weights, which the cache key does not; beside it
`swap_runtime.c`, the interpreter (kiln_swap_run.c), the same text for every model.

A record the table cannot express (a constant without a replay, a dtype outside
`DTYPES` such as float16 or bfloat16, a `dot` of other than two matrices) gives no
program: the C entry then says the library cannot swap, and `Module.swap_weights` replays
the record with numpy instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.artifact import Artifact
from kiln.codegen.host import host_runtime_path
from kiln.codegen.naming import consts_symbol, swap_symbols
from kiln.runtime.weights_check import rewritten_symbol

MAGIC = 0x314D5250575358  # "XSWPRM1" (little-endian bytes)
VERSION = 1
PROGRAM_FILE = "swap_program.c"
RUNTIME_ARTIFACT = "swap_runtime.c"
RUNTIME_FILE = "kiln_swap_run.c"  # next to kiln_host.c
# The program's dtypes, in kiln_swap.c's enum order.
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64")
OPS = {"weight": 1, "value": 2, "full": 3, "transpose": 4, "reshape": 5, "astype": 6,
       "pad": 7, "broadcast_to": 8, "slice": 9, "apply": 10}
FUNCTIONS = {"add": 1, "subtract": 2, "multiply": 3, "divide": 4, "sqrt": 5, "dot": 6,
             "take": 7}
RANK = 8  # KILN_SWAP_RANK
_FLOAT_COMPUTE = ("float32", "float64")


class Unsupported(Exception):
    """The record holds something the table cannot express."""


def _dtype(name: str) -> int:
    if name not in DTYPES:
        raise Unsupported(f"dtype {name}")
    return DTYPES.index(name)


def _head(op: str, dtype: str, shape: Sequence[int]) -> list[int]:
    if len(shape) > RANK:
        raise Unsupported(f"{len(shape)} dimensions")
    return [OPS[op], _dtype(dtype), len(shape), *(int(d) for d in shape)]


def _words(data: np.ndarray) -> list[int]:
    raw = np.ascontiguousarray(data).tobytes()
    raw += bytes(-len(raw) % 8)
    return [int(w) for w in np.frombuffer(raw, "<i8")]


def _widen(dtype: str) -> str:
    return "float32" if dtype in ("float16", "bfloat16") else dtype


class _Encoder:
    """Writes nodes (prefix order) and works out each one's dtype and shape."""

    def __init__(self, weights: Mapping[str, tuple[str, tuple[int, ...]]],
                 index: Mapping[str, int]) -> None:
        self.weights = weights
        self.index = index
        self.out: list[int] = []

    def node(self, n: Mapping[str, Any]) -> tuple[str, tuple[int, ...]]:
        if "weight" in n:
            dtype, shape = self.weights[n["weight"]]
            self.out += [*_head("weight", dtype, shape), self.index[n["weight"]]]
            return dtype, shape
        if "value" in n or "full" in n:
            dtype, shape = str(n["dtype"]), tuple(int(d) for d in n["shape"])
            if "value" in n:
                words = _words(np.array(n["value"], np.dtype(dtype)).reshape(shape))
                self.out += [*_head("value", dtype, shape), len(words), *words]
            else:
                self.out += [*_head("full", dtype, shape),
                             *_words(np.full((), n["full"], np.dtype(dtype)))]
            return dtype, shape
        op = n.get("op")
        if op == "apply":
            return self.apply(n)
        if op not in OPS:
            raise Unsupported(f"step {op!r}")
        child = _Encoder(self.weights, self.index)
        xdtype, xshape = child.node(n["x"])
        dtype, shape, params = _step_result(op, n, xdtype, xshape)
        self.out += [*_head(op, dtype, shape), *params, *child.out]
        return dtype, shape

    def apply(self, n: Mapping[str, Any]) -> tuple[str, tuple[int, ...]]:
        fn = str(n.get("fn"))
        if fn not in FUNCTIONS:
            raise Unsupported(f"function {fn!r}")
        child = _Encoder(self.weights, self.index)
        args = [child.node(a) for a in n["args"]]
        dtype = str(n["dtype"])
        compute, shape, axis = _apply_result(fn, args, n)
        self.out += [*_head("apply", dtype, shape), FUNCTIONS[fn], len(args), axis,
                     _dtype(compute), *child.out]
        return dtype, shape


def _step_result(op: str, n: Mapping[str, Any], dtype: str, shape: tuple[int, ...]
                 ) -> tuple[str, tuple[int, ...], list[int]]:
    """The dtype, shape and parameter words of step `op` on a source of `dtype`, `shape`."""
    if op == "transpose":
        perm = [int(a) for a in n["perm"]]
        return dtype, tuple(shape[a] for a in perm), perm
    if op == "reshape":
        dims, size = [int(d) for d in n["shape"]], int(np.prod(shape, dtype=np.int64))
        if -1 in dims:
            known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
            dims[dims.index(-1)] = size // known if known else 0
        if int(np.prod(dims, dtype=np.int64)) != size:
            raise Unsupported(f"reshape of {list(shape)} to {n['shape']}")
        return dtype, tuple(dims), []
    if op == "astype":
        return str(n["dtype"]), shape, []
    if op == "pad":
        widths = [(int(a), int(b)) for a, b in n["widths"]]
        return dtype, tuple(a + d + b for (a, b), d in zip(widths, shape)), \
            [a for a, _ in widths]
    if op == "broadcast_to":
        out = tuple(int(d) for d in n["shape"])
        np.broadcast_shapes(shape, out)
        return dtype, out, []
    # slice: numpy's bounds per axis, as (start, step, count)
    bounds = list(n["bounds"]) + [[None, None, None]] * (len(shape) - len(n["bounds"]))
    starts, steps, counts = [], [], []
    for (a, b, c), d in zip(bounds, shape):
        start, stop, step = slice(a, b, c).indices(d)
        starts.append(start)
        steps.append(step)
        counts.append(len(range(start, stop, step)))
    return dtype, tuple(counts), [*starts, *steps]


def _apply_result(fn: str, args: list[tuple[str, tuple[int, ...]]], n: Mapping[str, Any]
                  ) -> tuple[str, tuple[int, ...], int]:
    """The compute dtype (numpy's loop dtype on the widened operands), the result's shape
    and take's axis."""
    if fn == "take":
        (xd, xs), (idd, ids) = args
        axis = int(n.get("axis", 0)) % len(xs)
        if not idd.startswith("int"):
            raise Unsupported("take by non-integer indices")
        return xd, (*xs[:axis], *ids, *xs[axis + 1:]), axis
    dummies = [np.ones((1,) * len(s), np.dtype(_widen(d))) for d, s in args]
    with np.errstate(all="ignore"):
        compute = np.asarray(getattr(np, fn)(*dummies)).dtype.name
    if compute not in _FLOAT_COMPUTE:
        raise Unsupported(f"{fn} in {compute}")
    if fn == "dot":
        (_, a), (_, b) = args
        if len(a) != 2 or len(b) != 2:
            raise Unsupported("dot of other than two matrices")
        return compute, (a[0], b[1]), 0
    return compute, tuple(np.broadcast_shapes(*(s for _, s in args))), 0


def _leaves(nodes: Sequence[Mapping[str, Any]]) -> set[str]:
    """The weights `nodes` read."""
    out, todo = set(), list(nodes)
    while todo:
        n = todo.pop()
        if "weight" in n:
            out.add(str(n["weight"]))
        todo.extend(n.get("args", ()))
        if isinstance(n.get("x"), Mapping):
            todo.append(n["x"])
    return out


def program(record: Mapping[str, Any]) -> tuple[list[int], list[str]] | None:
    """The swap program of `record` (its words and the raw weights' names, in order), or
    None when the record cannot be expressed (see the module docstring)."""
    constants = [c for c in record.get("constants", []) if "literal" not in c]
    used = _leaves(constants)
    weights = {name: (str(w["dtype"]), tuple(int(d) for d in w["shape"]))
               for name, w in record.get("weights", {}).items() if name in used}
    names = list(weights)
    index = {name: i for i, name in enumerate(names)}
    enc = _Encoder(weights, index)
    try:
        for name in names:
            dtype, shape = weights[name]
            if len(shape) > RANK:
                raise Unsupported("rank")
            enc.out += [_dtype(dtype), len(shape), *shape]
        for c in constants:
            if "unknown" in c:
                raise Unsupported(str(c["unknown"]))
            nbytes = int(np.prod(c["shape"], dtype=np.int64)) * np.dtype(c["dtype"]).itemsize
            enc.out += [int(c["offset"]), nbytes]
            dtype, shape = enc.node(c)
            if dtype != c["dtype"] or list(shape) != list(c["shape"]):
                raise Unsupported(f"the constant at byte {c['offset']} rebuilds as "
                                  f"{dtype}{list(shape)}")
    except (Unsupported, KeyError, ValueError, TypeError, ZeroDivisionError):
        return None
    head = [MAGIC, VERSION, len(names), len(constants), int(record["size"]), 0]
    return head + enc.out, names


def _c_words(words: Sequence[int]) -> list[str]:
    lines, row = [], []
    for w in words:
        row.append(f"{w}LL" if w != -(1 << 63) else "(-9223372036854775807LL - 1)")
        if len(row) == 8:
            lines.append("    " + ", ".join(row) + ",")
            row = []
    if row:
        lines.append("    " + ", ".join(row) + ",")
    return lines


def runtime_source(prefix: str) -> str:
    """`swap_runtime.c`: kiln_swap_run.c (the interpreter) with its symbols for `prefix`;
    the same text for every model of a prefix (one compile per build process)."""
    symbols = swap_symbols(prefix)
    defines = [f"#define KILN_SWAP_{k.upper()} {symbols[k]}" for k in ("run", "pause", "resume")]
    text = (host_runtime_path().parent / RUNTIME_FILE).read_text(encoding="utf-8")
    return "\n".join([f"/* {RUNTIME_ARTIFACT} -- generated by kiln. Do not edit. */", *defines,
                      f"#define KILN_SWAP_CONSTS {consts_symbol(prefix)}",
                      f"#define KILN_SWAP_REWRITTEN {rewritten_symbol(prefix)}", text])


def program_artifacts(record: Mapping[str, Any], prefix: str, codegen_id: str,
                      cflags: Sequence[str]) -> list[Artifact]:
    """`swap_program.c` (the program of `record` as the hidden `{prefix}_swap_program` and
    `{prefix}_swap_names`) and `swap_runtime.c` (its interpreter); none when the record has
    no program."""
    made = program(record)
    if made is None:
        return []
    words, names = made
    blob = b"".join(n.encode("utf-8") + b"\0" for n in names)
    chars = ", ".join(str(b) for b in blob) or "0"
    text = "\n".join([
        "/* swap_program.c -- generated by kiln: the swap program of docs/format.md. */",
        "#include <stdint.h>",
        f"__attribute__((visibility(\"hidden\"))) const int64_t {prefix}_swap_program[] = {{",
        *_c_words(words),
        "};",
        f"__attribute__((visibility(\"hidden\"))) const char {prefix}_swap_names[] = {{",
        f"    {chars}}};",
        "",
    ])
    return [Artifact(codegen_id, "native", PROGRAM_FILE, text.encode("utf-8"),
                     {"cflags": list(cflags)}),
            runtime_artifact(prefix, codegen_id, cflags)]


def runtime_artifact(prefix: str, codegen_id: str, cflags: Sequence[str]) -> Artifact:
    """`swap_runtime.c` of `prefix`, compiled with `cflags`: the same for every program."""
    return Artifact(codegen_id, "native", RUNTIME_ARTIFACT,
                    runtime_source(prefix).encode("utf-8"), {"cflags": list(cflags)})


__all__ = ["DTYPES", "FUNCTIONS", "MAGIC", "OPS", "PROGRAM_FILE", "RUNTIME_ARTIFACT",
           "RUNTIME_FILE", "VERSION", "Unsupported", "program", "program_artifacts",
           "runtime_artifact", "runtime_source"]
