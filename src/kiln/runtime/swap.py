"""`Module.swap_weights`: new weights into a loaded library, without the compiler.

The compiler stores, beside a library's constants (`constants.bin`'s metadata,
`replay`: docs/format.md, "The replay record"), how to rebuild each constant from the
model's named weights (the ONNX initializers): a short program of exact steps
(transpose, reshape, astype, zero padding) per constant, a literal (kept as compiled),
or `unknown` (made by a transform that records no replay: the library cannot swap).
`swap_weights(module, source)`:

1. reads the named weights of `source` (a dict name -> array, an `.npz` file, an ONNX
   file or ModelProto of the same graph: kiln.runtime.onnx_weights);
2. checks them against the record: every weight the library rebuilds given with its
   dtype and shape, the others (unused by the library, or read into its code at
   compile time, such as a Reshape's shape) absent or unchanged (their SHA-256), no
   name the model does not have; a `UsageError` names every problem and nothing changes;
3. when the library carries its swap program (docs/format.md, "The swap program"; a
   library of metadata version 7 or later, `swap` in its metadata), hands the raw
   weights to its C entry `{prefix}_swap_weights`, which rebuilds the constants and
   installs them under its own call guard (kiln_swap.c; docs/abi.md, "Swapping
   weights"); otherwise (an older library, or a record the program cannot express):
4. rebuilds every constant with numpy (bit-identical to the compile's numpy);
5. installs them between calls: the constants' pages are made writable (a private copy
   of the library's pages, of the same bytes: the file is not changed), then the
   library's call guard holds new calls and waits for the running ones
   (kiln.runtime.lifetime), the new constants are copied in, and calls resume. A call
   sees the old or the new weights, never a mix. Either way the library's weights check
   (`{prefix}_check_weights`, kiln_check.c) learns the new chunks' hashes, those of the
   chunks that were intact before: a check after the swap passes, damage is still found.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.artifact.elf import SHT_SYMTAB, read_symbols
from kiln.errors import ArgumentTypeError, FormatError, UsageError
from kiln.runtime import ctypes_abi
from kiln.runtime.jit_constants import reclaim
from kiln.runtime.libc import libc_function
from kiln.runtime.onnx_weights import read_onnx_weights
from kiln.runtime.page_advice import MADVISE
from kiln.runtime.shared_constants import before_swap

if TYPE_CHECKING:
    from kiln.runtime.module import LibraryModule, Module

REPLAY_VERSION = 1
_MADV_POPULATE_WRITE = 23  # linux/mman.h


def replay_record(module: Module) -> tuple[Any, dict[str, Any]]:
    """(the constants artifact, its replay record) of a loaded library; UsageError when it
    has none or cannot swap."""
    data = [a for a in getattr(module, "artifacts", []) if "chunk_sha256" in a.metadata
            and a.metadata.get("symbol")]
    if not data:
        raise UsageError(f"{_where(module)}: the library holds no constants to swap")
    if len(data) > 1:
        raise UsageError(f"{_where(module)}: swap_weights supports a library with one "
                         f"constant pool; this one has {len(data)}")
    record = data[0].metadata.get("replay")
    if not isinstance(record, Mapping):
        raise UsageError(f"{_where(module)}: the library records no replay of its weight "
                         "transforms (built before swap_weights, or from IR without named "
                         "weights): compile it again to swap its weights")
    if record.get("version") != REPLAY_VERSION:
        raise FormatError(f"{_where(module)}: replay record version {record.get('version')!r}"
                          f"; this runtime reads {REPLAY_VERSION}")
    return data[0], dict(record)


def not_replayable(record: Mapping[str, Any]) -> list[str]:
    """The constants of `record` that cannot be rebuilt, with why."""
    out = []
    for c in record.get("constants", []):
        if "unknown" in c:
            out.append(f"the constant at byte {c['offset']} ({c['dtype']}{c['shape']}): "
                       f"{c['unknown']}")
    return out


def read_source(source: Any) -> dict[str, np.ndarray]:
    """The named weights of `source`: a mapping name -> array, an `.npz` file, or an ONNX
    model (a `.onnx` path, its bytes, or an onnx.ModelProto)."""
    if isinstance(source, Mapping):
        out = {}
        for name, value in source.items():
            if not isinstance(name, str):
                raise ArgumentTypeError(f"swap_weights: weight names must be str, got "
                                        f"{type(name).__name__}")
            out[name] = np.asarray(value)
        return out
    if hasattr(source, "SerializeToString"):  # an onnx.ModelProto (onnx not imported)
        return read_onnx_weights(source.SerializeToString(), "the ModelProto")
    if isinstance(source, (bytes, bytearray, memoryview)):
        return read_onnx_weights(bytes(source), "the ONNX bytes")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise UsageError(f"swap_weights: {str(path)!r} is not a file")
        if path.suffix == ".npz":
            try:
                with np.load(path, allow_pickle=False) as npz:
                    return {k: npz[k] for k in npz.files}
            except (OSError, ValueError, zipfile.BadZipFile) as exc:
                raise FormatError(f"swap_weights: {str(path)!r} is not a readable .npz: "
                                  f"{exc}") from None
        return read_onnx_weights(path.read_bytes(), str(path), path.parent)
    raise ArgumentTypeError("swap_weights: source must be a dict of name -> array, an .npz "
                            "or .onnx path, ONNX bytes or an onnx.ModelProto, got "
                            f"{type(source).__name__}")


def check_source(record: Mapping[str, Any], named: Mapping[str, np.ndarray]) -> list[str]:
    """Every way `named` does not fit `record` (empty: it fits)."""
    problems = []
    weights: Mapping[str, Any] = record.get("weights", {})
    for name, want in weights.items():
        got = named.get(name)
        if got is None:
            if not want.get("fixed"):
                problems.append(f"'{name}' is missing ({want['dtype']}{want['shape']})")
            continue
        if got.dtype.name != want["dtype"] or list(got.shape) != list(want["shape"]):
            problems.append(f"'{name}' is {got.dtype.name}{list(got.shape)}, the library's "
                            f"is {want['dtype']}{want['shape']}")
        elif want.get("fixed") and want.get("sha256") is None:
            problems.append(f"'{name}' is not rebuilt by the library (unused, or dropped at "
                            "compile time) and too large for the compile to have kept its "
                            "SHA-256, so a new value cannot be checked: leave it out (a dict "
                            "or .npz without it) or compile")
        elif want.get("fixed") and \
                hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest() != want["sha256"]:
            problems.append(f"'{name}' differs from the compiled one, but the library does not "
                            "rebuild it (read into the code at compile time, or unused): a "
                            "new value needs a compile")
    unknown = sorted(set(named) - set(weights))
    if unknown:
        problems.append(f"{', '.join(map(repr, unknown[:8]))}"
                        f"{' ...' if len(unknown) > 8 else ''}: not weights of this model")
    return problems


# The numpy functions a replay may apply (the record's "apply" entries, docs/format.md).
APPLY_FUNCTIONS: dict[str, Any] = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
                   "divide": np.divide, "sqrt": np.sqrt, "dot": np.dot, "take": np.take}
# Keyword arguments an applied function takes from its record entry.
APPLY_KEYWORDS = {"take": ("axis",)}


def _widen(a: np.ndarray) -> np.ndarray:
    """16-bit floats as float32, as the operators' numpy references compute them."""
    return a.astype(np.float32) if a.dtype.kind == "f" and a.dtype.itemsize < 4 else a


def _apply(node: Mapping[str, Any], named: Mapping[str, np.ndarray]) -> np.ndarray:
    fn = APPLY_FUNCTIONS.get(str(node.get("fn")))
    if fn is None:
        raise FormatError(f"replay record: unknown function {node.get('fn')!r}")
    args = [_widen(np.asarray(_evaluate(a, named))) for a in node["args"]]
    kwargs = {k: int(node[k]) for k in APPLY_KEYWORDS.get(str(node["fn"]), ()) if k in node}
    with np.errstate(all="ignore"):
        return np.asarray(fn(*args, **kwargs)).astype(np.dtype(str(node["dtype"])))


def _pad(x: np.ndarray, widths: list[tuple[int, int]]) -> np.ndarray:
    """`x` with zeros before and after each axis (np.pad's values, without its generic
    and slower path; `x` itself when nothing is added)."""
    if not any(a or b for a, b in widths):
        return x
    out = np.zeros([a + n + b for (a, b), n in zip(widths, x.shape)], x.dtype)
    out[tuple(slice(a, a + n) for (a, _), n in zip(widths, x.shape))] = x
    return out


def _evaluate(node: Mapping[str, Any], named: Mapping[str, np.ndarray]) -> np.ndarray:
    if "weight" in node:
        return named[node["weight"]]
    if "value" in node:
        return np.array(node["value"], np.dtype(str(node["dtype"]))).reshape(node["shape"])
    if "full" in node:
        return np.full(node["shape"], node["full"], np.dtype(str(node["dtype"])))
    op = node.get("op")
    if op == "apply":
        return _apply(node, named)
    x = _evaluate(node["x"], named)
    if op == "transpose":
        return np.transpose(x, [int(a) for a in node["perm"]])
    if op == "reshape":
        return np.reshape(x, [int(d) for d in node["shape"]])
    if op == "astype":
        return x.astype(np.dtype(str(node["dtype"])), copy=False)
    if op == "pad":
        return _pad(x, [(int(a), int(b)) for a, b in node["widths"]])
    if op == "broadcast_to":
        return np.broadcast_to(x, [int(d) for d in node["shape"]])
    if op == "slice":
        return x[tuple(slice(a, b, c) for a, b, c in node["bounds"])]
    raise FormatError(f"replay record: unknown step {op!r}")


def rebuild(record: Mapping[str, Any], named: Mapping[str, np.ndarray]
            ) -> list[tuple[int, np.ndarray]]:
    """(offset, bytes) of every constant the record rebuilds from `named`."""
    out = []
    for c in record.get("constants", []):
        if "literal" in c:
            continue
        try:
            value = np.asarray(_evaluate(c, named), order="C")  # (ascontiguousarray: 0-d -> 1-d)
        except IndexError as exc:  # new indices of a folded gather out of range
            raise UsageError(f"the new weights do not fit the compiled transforms of the "
                             f"constant at byte {c['offset']}: {exc}") from None
        if value.dtype.name != c["dtype"] or list(value.shape) != list(c["shape"]):
            raise FormatError(f"replay record: the constant at byte {c['offset']} rebuilds "
                              f"as {value.dtype.name}{list(value.shape)}, expected "
                              f"{c['dtype']}{c['shape']} (damaged record)")
        out.append((int(c["offset"]), value.reshape(-1).view(np.uint8)))
    return out


def constants_address(lib: LibraryModule, symbol: str) -> int:
    """Where the hidden constants symbol `symbol` is mapped in `lib` (read from the
    library's `.symtab`, placed by its exported blob symbol)."""
    blob = f"{lib.prefix}_blob"
    fd = os.open(lib.path, os.O_RDONLY)
    try:
        elf = read_symbols(fd, str(lib.path), (SHT_SYMTAB,))
    finally:
        os.close(fd)
    found = {s.name: s.value for s in elf.symbols if s.name in (symbol, blob)}
    if len(found) != 2:
        raise UsageError(f"{lib.path}: no symbol table naming {symbol} (a stripped library?)"
                         "; swap_weights needs the library as kiln exported it")
    base = ctypes.addressof(ctypes.c_uint8.in_dll(lib.cdll, blob)) - found[blob]
    return base + found[symbol]


def _mappings(lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(start, end, prot) of this process's mappings over [lo, hi), from /proc/self/maps."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            a, b = (int(x, 16) for x in span.split("-"))
            if a < hi and b > lo:
                prot = ((mmap.PROT_READ if perms[0] == "r" else 0)
                        | (mmap.PROT_WRITE if perms[1] == "w" else 0)
                        | (mmap.PROT_EXEC if perms[2] == "x" else 0))
                out.append((max(a, lo), min(b, hi), prot))
    return out


@contextmanager
def _writable(start: int, length: int) -> Iterator[None]:
    """The pages of [start, start + length) writable meanwhile, then as they were."""
    page = mmap.PAGESIZE
    lo, hi = start // page * page, -(-(start + length) // page) * page
    spans = _mappings(lo, hi)
    if sum(b - a for a, b, _ in spans) != hi - lo:
        raise UsageError(f"the constants at 0x{start:x} are not mapped as expected")
    mprotect = libc_function("mprotect", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_int)
    if mprotect is None:
        raise UsageError("cannot make the constants' pages writable: the C library has no "
                         "mprotect; nothing was changed")
    done = []
    try:
        for a, b, prot in spans:
            if mprotect(a, b - a, prot | mmap.PROT_READ | mmap.PROT_WRITE) != 0:
                raise UsageError(f"cannot make the constants' pages writable (mprotect: "
                                 f"{os.strerror(ctypes.get_errno())}); nothing was changed")
            done.append((a, b, prot))
        # Fault the private copies (of the old bytes: a call reading them meanwhile sees
        # no change) in now, with one call where Linux can (5.14+), so the calls wait
        # only for the copy; elsewhere the copy faults them in.
        if MADVISE is not None:
            MADVISE(lo, hi - lo, _MADV_POPULATE_WRITE)
        yield
    finally:
        for a, b, prot in done:
            mprotect(a, b - a, prot)


# {prefix}_swap_weight(i, &name, &dtype, &ndim, &shape) and {prefix}_swap_weights(raw, n).
_WEIGHT_ARGS = [ctypes.c_int32, ctypes.POINTER(ctypes.c_char_p),
                ctypes.POINTER(ctypes_abi.DLDataType), ctypes.POINTER(ctypes.c_int32),
                ctypes.POINTER(ctypes.POINTER(ctypes.c_int64))]


def native_entry(lib: Any) -> tuple[Any, list[str]] | None:
    """(`{prefix}_swap_weights`, the raw weights' names in its order) of a library that
    carries its swap program, else None (numpy replays the record)."""
    symbols = lib.metadata.get("swap") if isinstance(getattr(lib, "metadata", None), dict) \
        else None
    if not isinstance(symbols, Mapping) or not symbols.get("symbol"):
        return None
    try:
        describe = lib.cdll[str(symbols["weight_symbol"])]
        entry = lib.cdll[str(symbols["symbol"])]
    except (AttributeError, KeyError):
        return None
    describe.restype, describe.argtypes = ctypes.c_int32, _WEIGHT_ARGS
    entry.restype = ctypes.c_int32
    entry.argtypes = [ctypes.POINTER(ctypes_abi.DLTensor), ctypes.c_int32]
    count = describe(-1, None, None, None, None)
    if count < 0:
        return None
    names = []
    for i in range(count):
        name = ctypes.c_char_p()
        describe(i, ctypes.byref(name), None, None, None)
        names.append((name.value or b"").decode("utf-8"))
    return entry, names


def native_swap(lib: Any, entry: tuple[Any, list[str]], named: Mapping[str, np.ndarray]
                ) -> None:
    """Run the library's `{prefix}_swap_weights` on `named` (checked against the record)."""
    fn, names = entry
    arrays = [np.asarray(named[n], order="C") for n in names]  # (0-d stays 0-d)
    args = [ctypes_abi.TensorArg(a, ctypes_abi.Where("swap_weights", i, n))
            for i, (a, n) in enumerate(zip(arrays, names))]
    raw = (ctypes_abi.DLTensor * max(len(args), 1))(*(a.tensor for a in args))
    status = fn(raw, len(args))
    if status != 0:
        message = lib.last_error()
        raise UsageError(f"{lib.path}: {message or 'swap_weights failed'} (status {status})")


def _where(module: Any) -> str:
    return str(getattr(module, "path", type(module).__name__))


def swap_weights(module: Module, source: Any) -> None:
    """Install the named weights of `source` into `module` (see the module docstring).

    Raises:
        UsageError: the library cannot swap (no record, constants it cannot rebuild), or
            `source` does not fit it (names every missing, extra, misshapen or changed
            fixed weight); nothing is changed.
        ArgumentTypeError: `source` is none of the accepted kinds.
        FormatError: the record or an ONNX source is damaged.
    """
    lib: Any = module
    if getattr(lib, "cdll", None) is None or not getattr(lib, "has_native", False):
        raise UsageError(f"swap_weights: {_where(module)} is not a loaded kiln shared "
                         "library (load the .so with kiln.runtime.load_module)")
    artifact, record = replay_record(lib)
    bad = not_replayable(record)
    if bad:
        raise UsageError(f"{lib.path}: cannot swap weights: {len(bad)} constant(s) are made "
                         f"by transforms without a replay: {'; '.join(bad[:4])}")
    named = read_source(source)
    problems = check_source(record, named)
    if problems:
        raise UsageError(f"{lib.path}: swap_weights: the weights do not fit the library: "
                         + "; ".join(problems))
    # Nobody reads these constants through another library, or this one's, from now on;
    # a jit library reads its own, no longer the compiler's arrays.
    reclaim(lib)
    before_swap(lib)
    entry = native_entry(lib)
    if entry is not None:
        lib.run_weight_checks()  # a pending lazy check must see the weights it was made for
        with lib.kept_open():  # the C holds the calls; close() must wait for it
            native_swap(lib, entry, named)
        return
    pieces = rebuild(record, named)
    lib.run_weight_checks()  # a pending lazy check must see the weights it was made for
    address = constants_address(lib, str(artifact.metadata["symbol"]))
    size = int(record["size"])
    rewritten = _check_follower(lib)
    with _writable(address, size), lib.calls_paused():
        view = np.frombuffer(memoryview((ctypes.c_uint8 * size).from_address(address)),
                             np.uint8)
        # The check's table follows, as in the C swap: one span, each chunk hashed once.
        lo = min((offset for offset, _ in pieces), default=0)
        hi = max((offset + data.nbytes for offset, data in pieces), default=0)
        rewritten(address + lo, hi - lo, 0)
        for offset, data in pieces:
            view[offset:offset + data.size] = data
        rewritten(address + lo, hi - lo, 1)


def _check_follower(lib: Any) -> Any:
    """`{prefix}_rehash_weights(data, size, phase)` of `lib` (kiln_check.c): phase 0
    before a swap writes, 1 after; a no-op for a library without the weights check."""
    try:
        return ctypes_abi.bind(lib.cdll, f"{lib.prefix}_rehash_weights", "rehash_weights")
    except AttributeError:
        return lambda _data, _size, _phase: 0


__all__ = ["REPLAY_VERSION", "check_source", "constants_address", "native_entry",
           "native_swap", "not_replayable", "read_source", "rebuild", "replay_record",
           "swap_weights"]
