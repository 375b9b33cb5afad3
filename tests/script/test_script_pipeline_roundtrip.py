"""The DSL round trip holds at every stage of compilation: after each
pass of the default graph and tensor pipelines, the module prints, parses back and
is structurally equal — for the IR corpus and for an operator graph that goes
through fusion, legalization and memory planning."""

from __future__ import annotations

import numpy as np
import pytest

from corpus import CORPUS
from kiln import ops
from kiln.ir import IRBuilder, IRModule, assert_structural_equal
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.script import from_source, print_module
from kiln.transform import PassContext
from kiln.transform.instruments import PassInstrument
from kiln.transform.pass_base import Pass
from kiln.transform.pipeline import get_pipeline


class _Capture(PassInstrument):
    def __init__(self) -> None:
        self.stages: list[tuple[str, IRModule]] = []

    def run_after_pass(self, mod: IRModule, p: Pass) -> None:
        if not p.is_container:
            self.stages.append((p.name, mod))


def _static(mod: IRModule) -> bool:
    for fn in mod.functions.values():
        params = fn.params
        for p in params:
            t = p.type if isinstance(p, g.Var) else None
            shape = t.shape if isinstance(t, TensorType) else getattr(p, "shape", ())
            if t is not None and not isinstance(t, TensorType):
                return False
            if not all(isinstance(d, int) for d in shape):
                return False
    return True


def _stages(mod: IRModule) -> list[tuple[str, IRModule]]:
    capture = _Capture()
    with PassContext(instruments=[capture]):
        lowered = get_pipeline("default", "graph")(mod)
        get_pipeline("default", "tensor")(lowered)
    return capture.stages


def _cnn() -> IRModule:
    rng = np.random.default_rng(0)
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (1, 3, 8, 8), "float32")
        w = g.Constant(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "w")
        b = g.Constant(rng.standard_normal((1, 4, 1, 1)).astype("float32"), "b")
        c = ib.emit(ops.call("conv2d", x, w, pads=(1, 1, 1, 1)), "c")
        r = ib.emit(ops.call("relu", ib.emit(ops.call("add", c, b), "a")), "r")
        p = ib.emit(ops.call("max_pool2d", r, kernel_shape=(2, 2), strides=(2, 2)), "p")
        f = ib.emit(ops.call("reshape", p, shape=(1, 64)), "f")
        ib.ret(ib.emit(ops.call("softmax", f, axis=-1), "y"))
    return ib.get()


CASES = {name: case.module for name, case in sorted(CORPUS.items())}
CASES["ops_cnn"] = _cnn


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_pipeline_stage_round_trips(name: str) -> None:
    mod = CASES[name]()
    if not _static(mod):
        pytest.skip("the native lowering needs static, flat signatures")
    stages = _stages(mod)
    assert stages, "the pipelines ran no pass"
    for pass_name, stage in stages:
        text = print_module(stage)
        try:
            assert_structural_equal(from_source(text), stage)
        except AssertionError as exc:
            raise AssertionError(f"round trip fails after pass {pass_name}: {exc}") from None
