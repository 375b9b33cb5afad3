"""The build matrix: which models to compile for which targets.

A JSON (or, with PyYAML installed, YAML) document:

    {"version": 1,
     "models": ["resnet.onnx", {"path": "bert.onnx", "shape": {"seq": 128}}],
     "targets": ["host", "c", "web/wasm32", {"kind": "llvm", "mtriple": "..."}]}

Model paths are relative to the matrix file. A target is anything `kiln.Target`
takes (a kind, a tag, a JSON object) or "host" (the machine that builds it: on a
cluster, the node that runs the task). `version` is optional; a newer one is
refused. Every mistake is a UsageError naming the entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import MissingFileError, UsageError

MATRIX_VERSION = 1
_KEYS = {"version", "models", "targets"}
_MODEL_KEYS = {"path", "shape"}


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
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"build matrix {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read build matrix {path}: {exc}") from None
    return parse_matrix(_decode(text, path), path.parent, str(path))


def _decode(text: str, path: Path) -> Any:
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise UsageError(f"{path}: YAML matrices need PyYAML (pip install pyyaml, or "
                             "'kiln-tensor[distributed]'); JSON needs nothing") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"{path}: not valid YAML: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON: {exc}") from None


def parse_matrix(data: Any, base: Path, where: str = "the build matrix") -> BuildMatrix:
    """Check the decoded document `data`; model paths are taken relative to `base`."""
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected an object with 'models' and 'targets', "
                         f"got {type(data).__name__}")
    unknown = sorted(map(str, set(data) - _KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(_KEYS))}")
    version = data.get("version", MATRIX_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UsageError(f"{where}: 'version' must be a positive integer, got {version!r}")
    if version > MATRIX_VERSION:
        raise UsageError(f"{where}: version {version} is newer than this kiln reads "
                         f"({MATRIX_VERSION}); upgrade kiln")
    models = [_model(m, base, f"{where}: models[{i}]")
              for i, m in enumerate(_list(data, "models", where))]
    targets = _list(data, "targets", where)
    for i, t in enumerate(targets):
        if not isinstance(t, str | dict) or not t:
            raise UsageError(f"{where}: targets[{i}] must be a target string or object, "
                             f"got {t!r}")
    names = [m.name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"{where}: two models named {', '.join(twice)} would write the "
                         "same output files; rename one")
    return BuildMatrix(tuple(models), tuple(targets))


def _list(data: dict[str, Any], key: str, where: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise UsageError(f"{where}: '{key}' must be a non-empty list, got {value!r}")
    return value


def _model(entry: Any, base: Path, where: str) -> ModelEntry:
    if isinstance(entry, str):
        entry = {"path": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise UsageError(f"{where}: expected a path or {{'path': ..., 'shape': {{...}}}}, "
                         f"got {entry!r}")
    unknown = sorted(map(str, set(entry) - _MODEL_KEYS))
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}")
    shape = entry.get("shape", {})
    if not isinstance(shape, dict) or not all(
            isinstance(k, str) and _is_size(v) for k, v in shape.items()):
        raise UsageError(f"{where}: 'shape' maps names to a size or a list of sizes "
                         f"(null keeps one symbolic), got {shape!r}")
    path = (base / entry["path"]).resolve()
    if not path.is_file():
        raise MissingFileError(f"{where}: model file {path} does not exist")
    return ModelEntry(path, {k: tuple(v) if isinstance(v, list) else v
                             for k, v in shape.items()})


def _is_size(value: Any) -> bool:
    """A shape_dict value: an int, or a list of ints and nulls."""
    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(value, list):
        return all(d is None or whole(d) for d in value)
    return whole(value)
