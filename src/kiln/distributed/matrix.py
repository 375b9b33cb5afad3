"""The build matrix: which models to compile for which targets.

A JSON (or, with PyYAML installed, YAML) document:

    {"version": 1,
     "models": ["resnet.onnx", {"path": "bert.onnx", "shape": {"seq": 128}}],
     "targets": ["host", "c", "web/wasm32", {"kind": "llvm", "mtriple": "..."}]}

Model paths are relative to the matrix file. A target is anything `kiln.Target`
takes (a kind, a tag, a JSON object) or "host" (the machine that builds it: on a
cluster, the node that runs the task). `version` is optional; a newer one is
refused. Every mistake is a UsageError naming the entry, its value shown cut short.

The file is untrusted input of bounded cost (docs/security.md, "Limits"): at most
`MAX_MATRIX_BYTES`, its size checked before it is read; JSON and YAML nested at most
`MAX_DEPTH` levels; YAML aliases expanding to at most `MAX_YAML_NODES` nodes (an
alias is a reference, and a few hundred bytes of aliases to aliases stand for
billions of nodes that any walk over the document visits); at most `MAX_CELLS`
cells; each model file at most kiln.frontend.onnx.file_limits.max_model_bytes(),
checked before it is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.artifact._json import text_depth
from kiln.artifact.capped import read_capped
from kiln.errors import UsageError, shown
from kiln.frontend.onnx.file_limits import check_model_file

MATRIX_VERSION = 1
_KEYS = {"version", "models", "targets"}
_MODEL_KEYS = {"path", "shape"}

#: The largest matrix file read: a thousand models and targets take a few hundred KiB.
MAX_MATRIX_BYTES = 1 << 20
#: The deepest nesting of a matrix document (a target object is a few levels deep).
MAX_DEPTH = 64
#: The most nodes a YAML matrix may expand to, aliases counted as what they stand for.
MAX_YAML_NODES = 100_000
#: The most (model, target) cells: each is a compile.
MAX_CELLS = 10_000
#: The largest dimension a `shape` entry may give (int64, what a shape holds).
MAX_DIM = (1 << 63) - 1


@dataclass(frozen=True)
class ModelEntry:
    """One model of the matrix: its file and the `shape_dict` it is imported with."""

    path: Path
    shape: dict[str, Any]

    @property
    def name(self) -> str:
        """The file name without its suffix (names the outputs)."""
        return self.path.stem


@dataclass(frozen=True)
class BuildMatrix:
    """Models x targets; `cells()` lists them model-major."""

    models: tuple[ModelEntry, ...]
    targets: tuple[Any, ...]

    def cells(self) -> list[tuple[ModelEntry, Any]]:
        """Every (model, target) pair, in the matrix's order."""
        return [(m, t) for m in self.models for t in self.targets]


def load_matrix(path: str | Path) -> BuildMatrix:
    """Read and check a matrix file (.json, .yaml or .yml)."""
    path = Path(path)
    data = read_capped(path, MAX_MATRIX_BYTES, f"build matrix {path}", UsageError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read build matrix {path}: not UTF-8 text ({exc.reason} at "
                         f"byte {exc.start})") from None
    return parse_matrix(_decode(text, path), path.parent, str(path))


def _decode(text: str, path: Path) -> Any:
    if path.suffix.lower() in (".yaml", ".yml"):
        return _decode_yaml(text, path)
    depth = text_depth(text)  # json.loads recurses once per level: measure it first
    if depth > MAX_DEPTH:
        raise UsageError(f"{path}: nested {depth} levels deep, deeper than {MAX_DEPTH}")
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or an int past Python's digit limit
        raise UsageError(f"{path}: not valid JSON: {str(exc)[:200]}") from None


def _decode_yaml(text: str, path: Path) -> Any:
    try:
        import yaml  # optional: yaml (the distributed extra)
    except ImportError:
        raise UsageError(f"{path}: YAML matrices need PyYAML (pip install pyyaml, or "
                         "'kiln-tensor[distributed]'); JSON needs nothing") from None
    loader = _bounded_loader(yaml)(text)
    try:
        return loader.get_single_data()
    except _TooLarge as exc:
        raise UsageError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {str(exc)[:400]}") from None
    except (ValueError, RecursionError) as exc:  # an int past Python's digit limit
        raise UsageError(f"{path}: not a YAML document kiln reads: {str(exc)[:200]}") from None
    finally:
        loader.dispose()


class _TooLarge(Exception):
    """A YAML document past MAX_DEPTH or MAX_YAML_NODES (refused while composing)."""


def _bounded_loader(yaml: Any) -> Any:
    """PyYAML's safe loader, refusing (with _TooLarge) documents nested deeper than
    MAX_DEPTH or expanding, aliases counted as what they stand for, to more than
    MAX_YAML_NODES nodes, before any Python object is built."""
    class BoundedLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise _TooLarge(f"nested deeper than {MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def get_single_node(self) -> Any:
            node = super().get_single_node()
            if node is not None:
                expanded_nodes(node, _TooLarge)
            return node

    return BoundedLoader


def expanded_nodes(root: Any, error: type[Exception], limit: int = MAX_YAML_NODES) -> int:
    """How many nodes the composed YAML node `root` stands for with every alias expanded,
    counted in time proportional to the distinct nodes (each node's count is kept);
    `error` when it is more than `limit` or an alias refers to a node containing it."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            if sizes[key] > limit:
                raise error(f"its aliases expand to more than {limit} nodes (an alias is a "
                            "copy of what it names; docs/security.md, \"Limits\")")
        elif key in open_nodes:
            raise error("an alias refers to a node that contains it")
        elif key not in sizes:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node))
    return sizes[id(root)]


def _children(node: Any) -> list[Any]:
    """The child nodes of a composed YAML node (a mapping's keys and values)."""
    value = node.value
    if not isinstance(value, list):
        return []  # a scalar
    return [x for item in value for x in (item if isinstance(item, tuple) else (item,))]


def parse_matrix(data: Any, base: Path, where: str = "the build matrix") -> BuildMatrix:
    """Check the decoded document `data`; model paths are taken relative to `base`."""
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected an object with 'models' and 'targets', "
                         f"got {type(data).__name__}")
    unknown = sorted(str(k)[:64] for k in set(data) - _KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown[:8])}; "
                         f"known: {', '.join(sorted(_KEYS))}")
    version = data.get("version", MATRIX_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UsageError(f"{where}: 'version' must be a positive integer, got "
                         f"{shown(version)}")
    if version > MATRIX_VERSION:
        raise UsageError(f"{where}: version {shown(version)} is newer than this kiln reads "
                         f"({MATRIX_VERSION}); upgrade kiln")
    entries, targets = _list(data, "models", where), _list(data, "targets", where)
    if len(entries) * len(targets) > MAX_CELLS:
        raise UsageError(f"{where}: {len(entries)} models x {len(targets)} targets are "
                         f"{len(entries) * len(targets)} cells, more than the {MAX_CELLS} "
                         "one matrix may hold; split it")
    models = [_model(m, base, f"{where}: models[{i}]") for i, m in enumerate(entries)]
    for i, t in enumerate(targets):
        if not isinstance(t, str | dict) or not t:
            raise UsageError(f"{where}: targets[{i}] must be a target string or object, "
                             f"got {shown(t)}")
    names = [m.name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"{where}: two models named {', '.join(twice[:8])} would write the "
                         "same output files; rename one")
    return BuildMatrix(tuple(models), tuple(targets))


def _list(data: dict[str, Any], key: str, where: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise UsageError(f"{where}: '{key}' must be a non-empty list, got {shown(value)}")
    return value


def _model(entry: Any, base: Path, where: str) -> ModelEntry:
    if isinstance(entry, str):
        entry = {"path": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise UsageError(f"{where}: expected a path or {{'path': ..., 'shape': {{...}}}}, "
                         f"got {shown(entry)}")
    unknown = sorted(str(k)[:64] for k in set(entry) - _MODEL_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown[:8])}")
    shape = entry.get("shape", {})
    if not isinstance(shape, dict) or not all(
            isinstance(k, str) and _is_size(v) for k, v in shape.items()):
        raise UsageError(f"{where}: 'shape' maps names to a size or a list of sizes from 0 "
                         f"to {MAX_DIM} (null keeps one symbolic), got {shown(shape)}")

    if not entry["path"] or "\0" in entry["path"]:
        raise UsageError(f"{where}: 'path' must name a file, got {shown(entry['path'])}")
    path = (base / entry["path"]).resolve()
    # its size before the build reads it (kiln.distributed.build reads it whole)
    check_model_file(path, f"{where}: model file {shown(str(path), 300)}")
    return ModelEntry(path, {k: tuple(v) if isinstance(v, list) else v
                             for k, v in shape.items()})


def _is_size(value: Any) -> bool:
    """A shape_dict value: a size, or a list of sizes and nulls (sizes 0 to MAX_DIM)."""
    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM

    if isinstance(value, list):
        return all(d is None or whole(d) for d in value)
    return whole(value)
