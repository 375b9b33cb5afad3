"""ONNX index-taking nodes with in-range and out-of-range runtime indices.

Shared by tests/ops/test_index_checks.py and the subprocess it starts (a
failing check must raise, never crash, so kiln runs them in a child process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from support.graphs import GraphBuilder

F, I64 = TensorProto.FLOAT, TensorProto.INT64


@dataclass
class Case:
    name: str
    node: Any
    inputs: list[tuple[str, int, list[int]]]
    output: tuple[int, list[int]]
    good: list[dict[str, np.ndarray]]
    bad: list[dict[str, np.ndarray]] = field(default_factory=list)
    inits: dict[str, np.ndarray] = field(default_factory=dict)

    def model(self) -> Any:
        b = GraphBuilder()
        b.add(self.node)
        for n, t, s in self.inputs:
            b.input(n, s, t)
        elem, shape = self.output
        b.output("y", shape, elem)
        b.consts(self.inits)
        return b.model(name=self.name)


def _x(*shape: int) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1


def _i(values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def cases() -> list[Case]:
    """Every case; `bad` feeds hold an index onnxruntime rejects."""
    return [
        Case("Gather", helper.make_node("Gather", ["x", "i"], ["y"], axis=1),
             [("x", F, [3, 4]), ("i", I64, [2, 2])], (F, [3, 2, 2]),
             good=[{"x": _x(3, 4), "i": _i([[0, -1], [3, -4]])}],
             bad=[{"x": _x(3, 4), "i": _i([[0, 4], [1, 1]])},
                  {"x": _x(3, 4), "i": _i([[0, 0], [-5, 1]])}]),
        Case("GatherElements", helper.make_node("GatherElements", ["x", "i"], ["y"], axis=0),
             [("x", F, [3, 2]), ("i", I64, [2, 2])], (F, [2, 2]),
             good=[{"x": _x(3, 2), "i": _i([[0, -1], [2, -3]])}],
             bad=[{"x": _x(3, 2), "i": _i([[3, 0], [0, 0]])}]),
        Case("GatherND", helper.make_node("GatherND", ["x", "i"], ["y"]),
             [("x", F, [2, 3]), ("i", I64, [2, 2])], (F, [2]),
             good=[{"x": _x(2, 3), "i": _i([[0, -1], [-2, 2]])}],
             bad=[{"x": _x(2, 3), "i": _i([[2, 0], [0, 0]])},
                  {"x": _x(2, 3), "i": _i([[0, 3], [0, 0]])}]),
        Case("ScatterElements",
             helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1),
             [("x", F, [2, 3]), ("i", I64, [2, 2]), ("u", F, [2, 2])], (F, [2, 3]),
             good=[{"x": _x(2, 3), "i": _i([[0, -1], [2, 1]]), "u": -_x(2, 2)}],
             bad=[{"x": _x(2, 3), "i": _i([[0, 3], [1, 1]]), "u": -_x(2, 2)}]),
        Case("ScatterND", helper.make_node("ScatterND", ["x", "i", "u"], ["y"]),
             [("x", F, [4, 2]), ("i", I64, [2, 1]), ("u", F, [2, 2])], (F, [4, 2]),
             good=[{"x": _x(4, 2), "i": _i([[0], [-1]]), "u": -_x(2, 2)}],
             bad=[{"x": _x(4, 2), "i": _i([[4], [0]]), "u": -_x(2, 2)}]),
        Case("ReverseSequence",
             helper.make_node("ReverseSequence", ["x", "i"], ["y"], batch_axis=1, time_axis=0),
             [("x", F, [4, 2]), ("i", I64, [2])], (F, [4, 2]),
             good=[{"x": _x(4, 2), "i": _i([4, 0])}],
             bad=[{"x": _x(4, 2), "i": _i([5, 1])}]),
        # Out-of-range OneHot indices are no error (ONNX: an all-off row).
        Case("OneHot", helper.make_node("OneHot", ["i", "d", "v"], ["y"]),
             [("i", I64, [4]), ("v", F, [2])], (F, [4, 3]),
             good=[{"i": _i([0, -1, 3, -4]), "v": np.array([0, 5], np.float32)}],
             inits={"d": _i(3)}),
    ]


def run_on(target: str) -> dict[str, Any]:
    """Compile every case for `target`; per case the outputs of good feeds, the errors
    of bad ones (a class name and message, or None if the call returned)."""
    import kiln
    from kiln.frontend import from_onnx

    results: dict[str, Any] = {}
    for case in cases():
        mod = from_onnx(case.model())
        fn = kiln.compile(mod, target)["main"]
        good = [np.asarray(fn(*feed.values())).tolist() for feed in case.good]
        bad: list[Any] = []
        for feed in case.bad:
            try:
                fn(*feed.values())
                bad.append(None)
            except kiln.errors.KilnError as exc:
                bad.append([type(exc).__name__, [c.__name__ for c in type(exc).__mro__],
                            str(exc)])
        results[case.name] = {"good": good, "bad": bad}
    return results
