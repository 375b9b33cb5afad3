"""TimingInstrument reports the backend steps of a build, not only the passes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.ir import IRBuilder
from kiln.ir import graph as g
from kiln.transform import PassContext, TimingInstrument
from kiln.transform.instruments import PassInstrument, timed_step
from support import ir_samples


def _weights_module() -> kiln.IRModule:
    table = np.arange(4096, dtype=np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (4096,), "float32")
        ib.ret(ib.emit(kiln.ops.call("add", x, g.Constant(table, "table")), "y"))
    return ib.get()


def test_compile_and_export_steps_are_timed(tmp_path: Path) -> None:
    timing = TimingInstrument()
    with PassContext(instruments=[timing]):
        ex = kiln.compile(_weights_module(), "llvm")
        ex.export_library(tmp_path / "m.so")
    names = [s.name for s in timing.steps]
    # LLVM's work: one module, or its parts (kiln.codegen.llvm.parts) where they are joined
    llvm = "codegen.parts" if "codegen.parts" in names else "codegen.emit_object"
    for step in ("constants", "fingerprint", "cache.lookup", "codegen", "codegen.lower", llvm,
                 "cache.store", "export", "export.compile", "export.data", "export.link"):
        assert step in names, names
    depth = {s.name: s.depth for s in timing.steps}
    assert depth["codegen"] == 0 and depth[llvm] == 1
    assert depth["export"] == 0 and depth["export.link"] == 1
    # Nested steps fit inside their parent; times are real wall-clock times.
    inner = sum(timing.step_seconds(n) for n in ("export.compile", "export.data", "export.link"))
    assert 0 < inner <= timing.step_seconds("export")
    assert timing.step_seconds(llvm) <= timing.step_seconds("codegen")
    report = timing.report()
    assert "export.link" in report and llvm in report
    assert timing.timings, "the passes are still timed"


def test_a_cache_hit_has_no_codegen_step() -> None:
    kiln.compile(ir_samples.chain_module(), "c")
    timing = TimingInstrument()
    with PassContext(instruments=[timing]):
        assert kiln.compile(ir_samples.chain_module(), "c").cache_hit
    names = [s.name for s in timing.steps]
    assert "cache.lookup" in names and "codegen" not in names


def test_custom_instruments_get_steps_and_failed_steps_are_not_reported() -> None:
    seen: list[tuple[str, int]] = []

    class Recorder(PassInstrument):
        def record_step(self, name: str, depth: int, seconds: float) -> None:
            assert seconds >= 0.01
            seen.append((name, depth))

    with PassContext(instruments=[Recorder()]):
        with timed_step("outer"), timed_step("inner"):
            time.sleep(0.01)
        with pytest.raises(RuntimeError), timed_step("broken"):
            raise RuntimeError("boom")
    assert seen == [("inner", 1), ("outer", 0)]
    with timed_step("nobody listens"):  # no instruments: nothing happens
        pass
