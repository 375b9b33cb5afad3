"""Tuning's search space, its selection from recorded measurements and a tuned build:
the tile a database chose is the one the passes record, the output equals the
untuned build's, the library metadata names the database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.distributed.executor import TaskOutcome
from kiln.distributed.tune import KernelSpec, discover, tune
from kiln.errors import FormatError
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ops.kernels.registry import KERNELS
from kiln.ops.kernels.tiles import tile_lanes, tile_registers
from kiln.target.isa import isa_for
from kiln.transform import PassContext
from kiln.transform.instruments import PassInstrument
from kiln.transform.pass_base import Pass
from kiln.tuning import Measurement, Record, TuningDatabase, target_key
from support.graphs import GraphBuilder, value_info

AVX2 = "llvm -mcpu=haswell"


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    """A 3x3 conv over 40 channels (blocked kernel), a 1x1 conv over a wide row
    (row-tiled or GEMM kernel) and a dense layer at batch 2 (packed GEMM)."""
    b = GraphBuilder(11)
    h = b.op("Relu", b.conv("x", 40, 16, 3))
    h = b.conv(h, 16, 8, 1)
    y = b.linear(b.op("Flatten", h), 8 * 4 * 16, 10)
    return b.model([value_info("x", [2, 40, 4, 16])], [value_info(y, [2, 10])], 17, "tiny")


@pytest.fixture(scope="module")
def specs(model: onnx.ModelProto) -> list[KernelSpec]:
    return discover(model, "host")


def _tile_ok(family: str, tile: tuple[int, ...], lanes: int, registers: int) -> bool:
    if family in ("gemm", "gemm_tiled", "conv_gemm"):
        mr, nr = tile
        vecs = nr // lanes
        return nr % lanes == 0 and mr * vecs + vecs + 1 <= registers
    if family == "conv_direct":
        cb, tw = tile
        return cb % lanes == 0 and cb // lanes * tw + cb // lanes + 1 <= registers
    if family == "conv_rows":
        rows, tw, lane = tile
        vecs = -(-tw // lanes)
        return lane == lanes and rows * vecs + vecs + 1 <= registers
    return False


@pytest.mark.parametrize("target", ["host", AVX2])
def test_candidates_are_legal_by_construction(model: onnx.ModelProto, target: str) -> None:
    tgt = kiln.Target.from_host() if target == "host" else kiln.Target(target)
    isa = isa_for(tgt)
    found = discover(model, tgt)
    # the 1x1 takes the row-tiled or the GEMM kernel, by how its 64 positions fill panels
    families = {s.family for s in found}
    assert families in ({"conv_direct", "conv_rows", "gemm"}, {"conv_direct", "conv_gemm", "gemm"})
    for s in found:
        assert s.candidates and s.default not in s.candidates
        assert len(set(s.candidates)) == len(s.candidates)
        for tile in (s.default, *s.candidates):
            assert _tile_ok(s.family, tile, tile_lanes(isa), tile_registers(isa)), (s, tile)
        assert KERNELS.get(s.family).name == s.family


class _AfterBlocking(PassInstrument):
    """The (op, tile) of every packed call after the blocking passes."""

    def __init__(self) -> None:
        self.tiles: list[tuple[str, tuple[int, ...]]] = []

    def run_after_pass(self, mod: IRModule, p: Pass) -> None:
        if p.name not in ("block-convolutions", "block-matmuls"):
            return
        for fn in mod.graph_funcs().values():
            for b in fn.bindings:
                if isinstance(b.value, g.Call) and b.value.op.startswith(
                        "conv2d_" if p.name == "block-convolutions" else "matmul_"):
                    self.tiles.append((b.value.op, tuple(b.value.attrs["tile"])))


def _database(specs: list[KernelSpec], key: str) -> TuningDatabase:
    """Recorded timings in which each kernel's first candidate is twice as fast."""
    return TuningDatabase(
        Record(s.family, s.signature, key, Measurement({"tile": list(s.default)}, (100.0,) * 5),
               [Measurement({"tile": list(s.candidates[0])}, (50.0, 51.0, 49.0, 50.0, 50.0))])
        for s in specs)


def test_a_tuned_build_uses_the_recorded_tiles(model: onnx.ModelProto, specs: list[KernelSpec],
                                               tmp_path: Path) -> None:
    target = kiln.Target.from_host()
    db = _database(specs, target_key(isa_for(target)))
    path = tmp_path / "model.tuning.json"
    db.save(path)
    capture = _AfterBlocking()
    with PassContext(instruments=[capture]):
        tuned = kiln.compile(model, target, tuning=str(path))
    print("\n".join(f"{op} tile={tile}" for op, tile in capture.tiles))
    # the IR records each kernel's chosen tile
    assert sorted(tile for _, tile in capture.tiles) == sorted(s.candidates[0] for s in specs)
    meta = tuned.metadata["tuning"]
    assert meta["fingerprint"] == TuningDatabase.load(path).fingerprint()
    assert sorted(v for v in meta["kernels"].values()) == sorted(
        list(s.candidates[0]) for s in specs)
    x = np.random.default_rng(0).standard_normal((2, 40, 4, 16)).astype(np.float32)
    want = kiln.compile(model, target).jit()["main"](x)
    np.testing.assert_allclose(np.asarray(tuned.jit()["main"](x)), np.asarray(want),
                               rtol=1e-4, atol=1e-5)


def test_a_database_of_another_cpu_is_ignored_and_a_corrupt_one_refused(
        specs: list[KernelSpec], model: onnx.ModelProto, tmp_path: Path) -> None:
    other = _database(specs, "x86_64:other:000000000000")
    with pytest.warns(UserWarning, match="no record for this target's CPU"):
        ex = kiln.compile(model, kiln.Target.from_host(), tuning=other)
    assert ex.metadata["tuning"]["kernels"] == {}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "kiln-tuning", "version": 1,
                               "records": [{"kernel": "gemm"}]}))
    with pytest.raises(FormatError, match=r"records\[0\]"):
        kiln.compile(model, kiln.Target.from_host(), tuning=bad)


def _fake_spec(name: str, candidates: int, count: int = 1) -> KernelSpec:
    return KernelSpec("gemm", f"matmul({name})", "matmul", (), {}, count, (8, 32),
                      tuple((c, 16) for c in range(1, candidates + 1)))


# Recorded medians (us) per (kernel, tile); the default is (8, 32). Tile (2, 16) of b
# computes something else (a wrong kernel), (3, 16) of a is within the noise.
RECORDED = {("matmul(a)", (8, 32)): 100.0, ("matmul(a)", (1, 16)): 120.0,
            ("matmul(a)", (2, 16)): 70.0, ("matmul(a)", (3, 16)): 99.0,
            ("matmul(b)", (8, 32)): 50.0, ("matmul(b)", (1, 16)): 45.0,
            ("matmul(b)", (2, 16)): 10.0}


def _run_recorded(budget: float) -> tuple[Any, list[str]]:
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    def build(args: Any) -> list[TaskOutcome]:
        return [TaskOutcome({"data": json.dumps([spec.signature, tile]).encode(),
                             "node": "n1"}) for spec, _, tile in args]

    def measure(args: Any) -> list[TaskOutcome]:
        out = []
        for spec, libs, _, repeats, _ in args:
            tiles = [tuple(json.loads(d)[1] or spec.default) for d in libs]
            times = [[RECORDED[spec.signature, t] * (1 + 0.001 * (r % 3)) for r in range(repeats)]
                     for t in tiles]
            equal = [not (spec.signature == "matmul(b)" and t == (2, 16)) for t in tiles]
            out.append(TaskOutcome({"times_us": times, "equal": equal, "node": "n2"}))
        return out

    report = tune([_fake_spec("a", 3, count=2), _fake_spec("b", 2)], "host", budget,
                  build=build, measure=measure, clock=clock, batch=2)
    return report, report.discarded


def test_tuning_chooses_from_recorded_measurements_deterministically() -> None:
    report, discarded = _run_recorded(1000)
    key = report.database.records()[0].target
    db = report.database
    assert db.lookup("gemm", "matmul(a)", key) == {"tile": [2, 16]}
    assert db.lookup("gemm", "matmul(b)", key) == {"tile": [1, 16]}  # (2, 16) differs
    assert discarded == ["gemm matmul(b) tile [2, 16]: result differs from the default's"]
    assert report.measured == 5 and report.measured_on == {"n2"}
    again, _ = _run_recorded(1000)
    assert again.database.fingerprint() == db.fingerprint()
    short, _ = _run_recorded(3)  # the budget ends it after the first round
    assert short.measured == 2
