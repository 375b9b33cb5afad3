"""The block the hand-written kernel tests (convolution, GEMM, GEMV, NCHWc) share:
one ONNX model of independent cases, its random feeds, the onnxruntime reference, a
`native` fixture over the llvm / llvm-avx2 / c targets, and the error check."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.driver.compiler import lower_for_codegen
from kiln.frontend import from_onnx
from kiln.ir.printer import print_func
from kiln.target import Target
from support.graphs import GraphBuilder
from support.numerics import assert_close
from support.processes import outputs_in_fresh_process
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target


def random_feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A float32 standard-normal array for every (static-shape) graph input."""
    return {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim])
            .astype(np.float32) for v in model.graph.input}


def branches_model(name: str, nodes: list[Any], inputs: list[Any], outputs: list[Any],
                   inits: list[Any]) -> onnx.ModelProto:
    """An opset-17 model of independent branches (one per kernel case)."""
    b = GraphBuilder()
    b.add(*nodes)
    b.consts(inits)
    return b.model(inputs, outputs, name=name, check=False)  # outputs of unknown rank


def kernel_calls(model: onnx.ModelProto, target: str, select: Callable[[str, Any], bool]
                 ) -> tuple[dict[str, Any], dict[str, int]]:
    """The kernels of `model` lowered for `target` that `select(name, function)` picks,
    and how many calls of each the graph's `main` makes."""
    lowered = lower_for_codegen(from_onnx(model), Target(target))
    main = print_func(lowered["main"])
    kernels = {name: f for name, f in lowered.functions.items() if select(name, f)}
    return kernels, {name: main.count(f'"{name}"') for name in kernels}


class KernelCases:
    """`model` (one branch per entry of `cases`) with feeds drawn from `rng`, checked
    against onnxruntime within relative L2 error `tol`."""

    def __init__(self, model: onnx.ModelProto, cases: Sequence[Any], tol: float,
                 rng: np.random.Generator) -> None:
        self.model, self.cases, self.tol = model, cases, tol
        self.feeds = random_feeds(model, rng)

    def reference(self) -> list[np.ndarray]:
        """onnxruntime's outputs on the feeds."""
        return onnxruntime_outputs(self.model, self.feeds)

    def assert_close(self, got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> None:
        """Every output within the tolerance of the reference (naming its case)."""
        assert_close([np.asarray(g) for g in got], want, self.tol, self.cases)

    def reference_fixture(self) -> Callable[[], list[np.ndarray]]:
        """A module-scoped `reference` fixture: onnxruntime's outputs, computed once."""

        @pytest.fixture(scope="module")
        def reference() -> list[np.ndarray]:
            return self.reference()

        return reference

    def native_fixture(self, **options: Any) -> Callable[..., kiln.driver.Executable]:
        """A module-scoped `native` fixture: the model compiled (with `options`) for each
        of NATIVE_TARGETS. Assign it to a module global named `native`."""
        model = self.model

        @pytest.fixture(scope="module", params=NATIVE_TARGETS)
        def native(request: pytest.FixtureRequest) -> kiln.driver.Executable:
            return kiln.compile(from_onnx(model), native_target(request.param), **options)

        return native

    def onnxruntime_tests(self) -> tuple[Callable[..., None], Callable[..., None]]:
        """`test_matches_onnxruntime` and `test_in_a_fresh_process` (2 threads) over the
        module's `native` and `reference` fixtures: assign them to module globals of
        those names."""

        def test_matches_onnxruntime(native: kiln.driver.Executable,
                                     reference: list[np.ndarray]) -> None:
            self.assert_close(list(native(*self.feeds.values())), reference)

        def test_in_a_fresh_process(native: kiln.driver.Executable, tmp_path: Path,
                                    reference: list[np.ndarray]) -> None:
            self.assert_close(outputs_in_fresh_process(native, self.feeds, tmp_path, 2),
                              reference)

        return test_matches_onnxruntime, test_in_a_fresh_process
