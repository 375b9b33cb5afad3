"""Running the compatibility scripts with onnxruntime and kiln, comparing each pair,
and the table of differences that docs/session.md shows (make_table.py writes it,
test_ort_compat.py checks it)."""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from compat_scripts import REASONS, SCRIPTS

import kiln

DOC = Path(__file__).resolve().parents[3] / "docs" / "session.md"
START = "<!-- ort-compat-table: written by tests/session/compat/make_table.py -->"
END = "<!-- ort-compat-table end -->"


def write_mlp(path: Path) -> Path:
    """The suite's model: a two-layer MLP over x[batch, 8] -> y[batch, 4], and Shape(x)."""
    import onnx
    from onnx import TensorProto

    from support.graphs import GraphBuilder

    b = GraphBuilder(seed=62)
    b.input("x", ["batch", 8])
    hidden = b.op("Relu", b.linear("x", 8, 16))
    b.node("Identity", [b.linear(hidden, 16, 4)], ["y"])
    b.node("Shape", ["x"], ["s"])
    b.output("y", ["batch", 4])
    b.output("s", [2], TensorProto.INT64)
    onnx.save(b.model(name="compat_mlp"), str(path))
    return path


@dataclass(frozen=True)
class Outcome:
    """What one script did with one module: its value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    def describe(self) -> str:
        return "runs" if self.error is None else f"raises {type(self.error).__name__}"


def run(rt: Any, name: str, model: Path) -> Outcome:
    """Script `name` with module `rt`, in a fresh scratch folder, warnings kept aside."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return Outcome(value=SCRIPTS[name](rt, str(model), Path(tmp)))
        except Exception as exc:  # the outcome compared
            return Outcome(error=exc)


def same_values(a: Any, b: Any) -> bool:
    """Whether two script results agree: arrays by dtype, shape and value (1e-5), lists
    and tuples element by element, the rest by ==."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and bool(
            np.allclose(a, b, rtol=1e-5, atol=1e-6))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    return bool(a == b)


def difference(ort: Outcome, got: Outcome) -> str | None:
    """None when kiln did as onnxruntime (equal values, or both raised), else what
    kiln did differently, as the table says it."""
    if ort.error is not None and got.error is not None:
        return None
    if ort.error is None and got.error is None:
        return None if same_values(ort.value, got.value) else "runs, with other values"
    return got.describe()


def outcomes(model: Path) -> dict[str, tuple[Outcome, Outcome]]:
    """Every script's (onnxruntime, kiln) outcome."""
    import onnxruntime

    return {name: (run(onnxruntime, name, model), run(kiln, name, model)) for name in SCRIPTS}


def render(pairs: dict[str, tuple[Outcome, Outcome]]) -> str:
    """The markdown table of the variants where kiln differs, with REASONS."""
    rows = ["| script | onnxruntime | kiln | why |", "|---|---|---|---|"]
    for name, (ort, got) in pairs.items():
        if difference(ort, got) is not None:
            rows.append(f"| `{name}` | {ort.describe()} | {difference(ort, got)} | "
                        f"{REASONS.get(name, '(no reason given)')} |")
    same = sum(difference(o, g) is None for o, g in pairs.values())
    return "\n".join([f"{same} of {len(pairs)} scripts run the same on both; the others:", "",
                      *rows])


def documented() -> str:
    """The table between the markers of docs/session.md."""
    text = DOC.read_text(encoding="utf-8")
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def write(table: str) -> None:
    """Replace the table between the markers of docs/session.md."""
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    DOC.write_text(f"{head}{START}\n{table}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")
