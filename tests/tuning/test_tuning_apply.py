"""Tuning's search space, its selection from recorded measurements and a tuned build:
the variant a database chose (a tile, a parallel split, K blocking, another convolution
kernel) is
the one the passes record and the code generator builds, the output equals the
untuned build's, the library metadata names the database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.distributed import tune as tune_module
from kiln.distributed.executor import TaskOutcome
from kiln.distributed.tune import (
    KernelSpec,
    build_variant,
    discover,
    evict_bytes,
    measure_kernel,
    measure_resource,
    show,
    tune,
)
from kiln.errors import FormatError, UsageError
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.tensor import Allocate, For, PrimFunc
from kiln.ir.visitor import post_order_visit
from kiln.kernels.registry import KERNELS
from kiln.kernels.search import CONV_ALGORITHMS
from kiln.kernels.tiles import PARALLEL_SPLITS, tile_lanes, tile_registers
from kiln.target.isa import isa_for
from kiln.transform import PassContext
from kiln.transform.instruments import PassInstrument
from kiln.transform.pass_base import Pass
from kiln.tuning import Measurement, Record, TuningDatabase, target_key
from support.graphs import GraphBuilder, value_info
from support.reference import onnxruntime_outputs
from support.targets import native_target

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
    if family == "conv_winograd":
        m, mr, nr = tile
        vecs = nr // lanes
        return m in (2, 4) and nr % lanes == 0 and mr * vecs + vecs + 1 <= registers
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
        assert len({json.dumps(c, sort_keys=True) for c in s.candidates}) == len(s.candidates)
        for params in (s.default, *s.candidates):
            family = params.get("family", s.family)
            assert _tile_ok(family, tuple(params["tile"]), tile_lanes(isa),
                            tile_registers(isa)), (s, params)
            assert params.get("split", "outer") in PARALLEL_SPLITS
        kinds = {k for c in s.candidates for k in c}
        # every kernel has a parallel split to try; every convolution another algorithm
        assert "split" in kinds and ("family" in kinds) == s.family.startswith("conv")
        assert all(c["family"] in CONV_ALGORITHMS for c in s.candidates if "family" in c)
        assert KERNELS.get(s.family).name == s.family


class _AfterBlocking(PassInstrument):
    """The (op, tile, split) of every packed call after the blocking passes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...], str | None, bool | None]] = []

    def run_after_pass(self, mod: IRModule, p: Pass) -> None:
        if p.name not in ("block-convolutions", "block-matmuls"):
            return
        for fn in mod.graph_funcs().values():
            for b in fn.bindings:
                if isinstance(b.value, g.Call) and b.value.op.startswith(
                        "conv2d_" if p.name == "block-convolutions" else "matmul_"):
                    attrs = b.value.attrs
                    self.calls.append((b.value.op, tuple(attrs["tile"]), attrs.get("split"),
                                       attrs.get("kblock")))


def _database(specs: list[KernelSpec], key: str, chosen: dict[str, dict[str, Any]]
              ) -> TuningDatabase:
    """Recorded timings in which the variant `chosen[family]` is twice as fast."""
    return TuningDatabase(
        Record(s.family, s.signature, key, Measurement(s.default, (100.0,) * 5),
               [Measurement(chosen[s.family], (50.0, 51.0, 49.0, 50.0, 50.0), True,
                            (100.0,) * 5)])
        for s in specs)


def _first(spec: KernelSpec, kind: str) -> dict[str, Any]:
    """The first candidate of `spec` that changes only `kind` (tile, split or family)."""
    return next(c for c in spec.candidates if set(c) == {"tile", kind})


def _allocates(buffer: str, ex: Any) -> list[str]:
    """The kernel kinds (`kiln.gemm_kernel`) of a build that allocate `buffer`."""
    found: set[str] = set()
    for f in ex.ir.functions.values():
        if isinstance(f, PrimFunc):
            post_order_visit(f, lambda n, f=f: found.add(str(f.attrs.get("kiln.gemm_kernel")))
                             if isinstance(n, Allocate) and n.buffer.name == buffer else None)
    return sorted(found)


def parallel_kernels(ex: Any) -> list[str]:
    """The kernels of a build that hold a parallel loop."""
    found: set[str] = set()
    for name, f in ex.ir.functions.items():
        if isinstance(f, PrimFunc):
            post_order_visit(f, lambda n, name=name: found.add(name) if isinstance(n, For)
                             and n.kind == "parallel" else None)
    return sorted(found)


def test_a_tuned_build_applies_every_kind_of_variant(
        model: onnx.ModelProto, specs: list[KernelSpec], tmp_path: Path) -> None:
    target = kiln.Target.from_host()
    by_family = {s.family: s for s in specs}
    conv3x3 = by_family["conv_direct"]
    conv1x1 = next(s for f, s in by_family.items() if f in ("conv_rows", "conv_gemm"))
    # the 3x3 on one thread, the 1x1 on another convolution kernel, the dense layer
    # (K = 512) with another tile and its sums blocked along K
    assert _first(by_family["gemm"], "kblock") == {**by_family["gemm"].default,
                                                   "kblock": True}
    chosen = {"conv_direct": {**conv3x3.default, "split": "serial"},
              conv1x1.family: _first(conv1x1, "family"),
              "gemm": {**_first(by_family["gemm"], "tile"), "kblock": True}}
    db = _database(specs, target_key(isa_for(target)), chosen)
    path = tmp_path / "model.tuning.json"
    db.save(path)
    capture = _AfterBlocking()
    # no model check recorded a verdict for this model: applied with a warning
    with PassContext(instruments=[capture]), \
            pytest.warns(UserWarning, match="3 tuned kernel.* not checked in this model"):
        tuned = kiln.compile(model, target, tuning=str(path))
    untuned = kiln.compile(model, target)
    print("\n".join(map(str, capture.calls)), parallel_kernels(untuned), parallel_kernels(tuned))
    alt = KERNELS.get(chosen[conv1x1.family]["family"])
    assert sorted(capture.calls, key=str) == sorted([
        ("conv2d_blocked", tuple(conv3x3.default["tile"]), "serial", None),
        (alt.op, tuple(chosen[conv1x1.family]["tile"]), None, None),
        ("matmul_packed", tuple(chosen["gemm"]["tile"]), None, True)], key=str)
    # K blocking keeps the dense layer's partial sums in a `sums` array
    assert _allocates("sums", tuned) == ["matmul_packed"] and not _allocates("sums", untuned)
    # the serial split leaves the 3x3's kernel (fused with its Relu) without a parallel
    # loop; the 1x1 moved to the blocked kernel, which has one
    assert "fused_conv2d_blocked_relu" in parallel_kernels(untuned)
    assert "fused_conv2d_blocked_relu" not in parallel_kernels(tuned)
    meta = tuned.metadata["tuning"]
    assert meta["fingerprint"] == TuningDatabase.load(path).fingerprint()
    assert meta["checked_in_model"] is False
    assert sorted(map(show, meta["kernels"].values())) == sorted(map(show, chosen.values()))
    x = np.random.default_rng(0).standard_normal((2, 40, 4, 16)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(tuned.jit()["main"](x)),
                               np.asarray(untuned.jit()["main"](x)), rtol=1e-4, atol=1e-5)


def test_a_database_of_another_cpu_is_ignored_and_a_corrupt_one_refused(
        specs: list[KernelSpec], model: onnx.ModelProto, tmp_path: Path) -> None:
    firsts = {s.family: s.candidates[0] for s in specs}
    other = _database(specs, "x86_64:other:000000000000", firsts)
    with pytest.warns(UserWarning, match="no record for this target's CPU"):
        ex = kiln.compile(model, kiln.Target.from_host(), tuning=other)
    assert ex.metadata["tuning"]["kernels"] == {}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "kiln-tuning", "version": 2,
                               "records": [{"kernel": "gemm"}]}))
    with pytest.raises(FormatError, match=r"records\[0\]"):
        kiln.compile(model, kiln.Target.from_host(), tuning=bad)
    # a variant the kernel cannot take (edited by hand) is refused, not built
    key = target_key(isa_for(kiln.Target.from_host()))
    for wrong, message in (({"family": "conv_rows", "tile": [6, 16, 16]}, "does not compute"),
                           ({"tile": [2, 16], "split": "sideways"}, "split 'sideways'")):
        with pytest.raises(UsageError, match=message):
            kiln.compile(model, kiln.Target.from_host(),
                         tuning=_database(specs, key, {**firsts, "gemm": wrong}))


def _fake_spec(name: str, candidates: int, count: int = 1) -> KernelSpec:
    return KernelSpec("gemm", f"matmul({name})", "matmul", (), {}, count, {"tile": [8, 32]},
                      ({"tile": [8, 32], "split": "serial"},
                       *({"tile": [c, 16]} for c in range(1, candidates + 1))))


# Recorded medians (us) per (kernel, variant); the default is tile (8, 32). Tile (2, 16)
# of b computes something else (a wrong kernel), (3, 16) of a is within the noise.
RECORDED = {("matmul(a)", '{"tile":[8,32]}'): 100.0,
            ("matmul(a)", '{"split":"serial","tile":[8,32]}'): 130.0,
            ("matmul(a)", '{"tile":[1,16]}'): 120.0, ("matmul(a)", '{"tile":[2,16]}'): 70.0,
            ("matmul(a)", '{"tile":[3,16]}'): 99.0,
            ("matmul(b)", '{"tile":[8,32]}'): 50.0,
            ("matmul(b)", '{"split":"serial","tile":[8,32]}'): 30.0,
            ("matmul(b)", '{"tile":[1,16]}'): 45.0, ("matmul(b)", '{"tile":[2,16]}'): 10.0}


def _run_recorded(budget: float) -> tuple[Any, list[str]]:
    # simulated time: a build task (two variants) and a measurement take 1 s each
    now = [0.0]

    def build(args: Any) -> list[TaskOutcome]:
        now[0] += 1.0
        return [TaskOutcome([{"data": show(params or spec.default).encode(), "node": "n1"}
                             for spec, _, params in jobs]) for (jobs,) in args]

    def measure(args: Any) -> list[TaskOutcome]:
        now[0] += 1.0
        out = []
        for spec, libs, _, repeats, _ in args:
            # the host drifts: block r runs every variant (1 + r % 4 / 2) times slower,
            # a relative spread of 50 % that no unpaired rule sees through; the pairs do
            times = [[RECORDED[spec.signature, d.decode()] * (1 + 0.001 * (r % 3))
                      * (1 + (r % 4) / 2) for r in range(repeats)] for d in libs]
            equal = [not (spec.signature == "matmul(b)" and d == b'{"tile":[2,16]}')
                     for d in libs]
            out.append(TaskOutcome({"times_us": times, "equal": equal, "node": "n2"}))
        return out

    report = tune([_fake_spec("a", 3, count=2), _fake_spec("b", 2)], "host", budget,
                  build=build, measure=measure, clock=lambda: now[0])
    return report, report.discarded


def test_tuning_chooses_from_recorded_measurements_deterministically() -> None:
    report, discarded = _run_recorded(1000)
    key = report.database.records()[0].target
    db = report.database
    assert db.lookup("gemm", "matmul(a)", key) == {"tile": [2, 16]}
    # b's serial split is the fastest that computes the same ((2, 16) differs)
    assert db.lookup("gemm", "matmul(b)", key) == {"split": "serial", "tile": [8, 32]}
    assert discarded == ['gemm matmul(b) {"tile":[2,16]}: result differs from the default\'s']
    assert report.measured == 7 and report.measured_on == {"n2"}
    again, _ = _run_recorded(1000)
    assert again.database.fingerprint() == db.fingerprint()
    # 5 s: a (called most) is built with one candidate and measured, then b; a third
    # build and measurement (2 s, the longest of each seen) would end past the budget
    short, _ = _run_recorded(5)
    assert short.measured == 2
    assert [(r.signature, len(r.default.times_us), len(r.candidates))
            for r in short.database.records()] == [("matmul(a)", 15, 1), ("matmul(b)", 15, 1)]


def test_the_inner_split_computes_the_untuned_result_with_a_symbolic_batch() -> None:
    """The "inner" order moves the batch, the one symbolic tile dimension, to the
    slowest place of the flat tile index: every tile is still visited once."""
    b = GraphBuilder(12)
    h = b.op("Relu", b.conv("x", 8, 16, 3))
    y = b.linear(b.op("Flatten", h), 16 * 4 * 16, 24)
    model = b.model([value_info("x", ["n", 8, 4, 16])], [value_info(y, ["n", 24])], 17,
                    "batched")
    target = kiln.Target.from_host()
    found = discover(model, target)
    assert {s.family for s in found} == {"conv_rows", "gemm"}  # 72 taps: row-tiled
    inner = {s.family: {**s.default, "split": "inner"} for s in found}
    with pytest.warns(UserWarning, match="not checked in this model"):
        tuned = kiln.compile(model, target,
                             tuning=_database(found, target_key(isa_for(target)), inner))
    assert sorted(map(show, tuned.metadata["tuning"]["kernels"].values())) == sorted(
        map(show, inner.values()))
    assert parallel_kernels(tuned)
    x = np.random.default_rng(1).standard_normal((3, 8, 4, 16)).astype(np.float32)
    lib = tuned.jit()
    lib.set_num_threads(2)
    (want,) = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_allclose(np.asarray(lib["main"](x)), want, rtol=1e-4, atol=1e-4)


def test_a_failing_build_or_measurement_leaves_its_kernel_alone() -> None:
    """A default that does not build, or a kernel whose measurement fails, is reported
    and left out; the other kernels are tuned, and the run ends."""
    def build(args: Any) -> list[TaskOutcome]:
        return [TaskOutcome([{"error": "CompileError: no"} if spec.signature == "matmul(c)"
                             else {"data": show(params or spec.default).encode(),
                                   "node": "n1"} for spec, _, params in jobs])
                for (jobs,) in args]

    def measure(args: Any) -> list[TaskOutcome]:
        return [TaskOutcome(error="RuntimeError: the node died")
                if spec.signature == "matmul(b)" else
                TaskOutcome({"times_us": [[RECORDED[spec.signature, d.decode()]] * repeats
                                          for d in libs],
                             "equal": [True] * len(libs), "node": "n2"})
                for spec, libs, _, repeats, _ in args]

    report = tune([_fake_spec("a", 3, count=2), _fake_spec("b", 2), _fake_spec("c", 1)],
                  "host", 1000, build=build, measure=measure, clock=lambda: 0.0)
    assert [r.signature for r in report.database.records()] == ["matmul(a)"]
    assert report.measured == 4
    assert any(d.startswith("gemm matmul(b): measurement failed") for d in report.discarded)
    assert any(d.startswith("gemm matmul(c) default: build failed") for d in report.discarded)


class _DeferringExecutor:
    """An executor of two CPUs whose tasks run only when waited for (as on a cluster,
    where they run meanwhile) and end in submission order, logging submissions and
    waits: the scheduling is visible."""

    def __init__(self, resource: str) -> None:
        self.events: list[str] = []
        self.resource = resource
        self.running = self.most = 0

    def put(self, value: Any) -> Any:
        return value

    def run(self, fn: Any, args: Any, **kw: Any) -> list[TaskOutcome]:
        return self.submit(fn, args, **kw)()

    def submit(self, fn: Any, args: Any, **kw: Any) -> Any:
        kind = fn.__name__
        self.events.append(f"submit {kind}")
        self.running += len(args)
        self.most = max(self.most, self.running)

        def wait() -> list[TaskOutcome]:
            self.events.append(f"wait {kind}")
            self.running -= len(args)
            if kind == "build_variants":
                return [TaskOutcome([{"data": show(params or spec.default).encode(),
                                      "node": "n1", "seconds": 1.0}
                                     for spec, _, params in jobs]) for (jobs,) in args]
            return [TaskOutcome({"times_us": [[RECORDED[spec.signature, d.decode()]] * repeats
                                              for d in libs],
                                 "equal": [True] * len(libs), "node": "n2"})
                    for spec, libs, _, repeats, _ in args]

        return wait

    def first_done(self, pending: Any) -> int:
        return 0

    def describe(self) -> dict[str, Any]:
        return {"engine": "in-process", "address": None,
                "nodes": [{"cpus": 2, "resources": [self.resource]}]}

    def close(self) -> None:
        pass


def test_builds_run_while_kernels_are_measured() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    ex = _DeferringExecutor(measure_resource(kiln.Target.from_host()))
    report = tune([_fake_spec("a", 3, count=2), _fake_spec("b", 2)], "host", 1000,
                  executor=ex, clock=clock)
    assert report.measured == 7
    # both CPUs busy from the start (a build each: the defaults of a and b, with a
    # candidate each), never more than one task per CPU
    assert ex.events[:2] == ["submit build_variants"] * 2 and ex.most == 2
    # a build starts while a measurement runs (between its submission and its end)
    overlapped = [i for i, e in enumerate(ex.events) if e == "submit measure_kernel"
                  and "submit build_variants" in ex.events[
                      i:ex.events.index("wait measure_kernel", i)]]
    assert overlapped
    key = report.database.records()[0].target
    assert report.database.lookup("gemm", "matmul(a)", key) == {"tile": [2, 16]}


@pytest.mark.parametrize("kind", ["llvm-avx2", "c"])
def test_k_blocking_computes_the_product_on_avx2_and_c(kind: str) -> None:
    """The K-blocked GEMM (`{"kblock": true}`) with 8-lane and generic tiles: K = 600 in
    several blocks (the last partial), 3 rows, 40 columns (a partial last panel)."""
    from kiln.tuning.apply import Forced, using

    target = native_target(kind)
    b = GraphBuilder(13)
    y = b.proj("x", 600, 40)
    model = b.model([value_info("x", [3, 600])], [value_info(y, [3, 40])], 17, "deep_k")
    (spec,) = discover(model, target)
    blocked = {**spec.default, "kblock": True}
    assert blocked in spec.candidates
    with using(Forced(spec.family, blocked)):
        ex = kiln.compile(model, target)
    assert _allocates("sums", ex)  # the sums were blocked
    x = np.random.default_rng(1).standard_normal((3, 600)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_allclose(np.asarray(ex(x)), ref, rtol=1e-4, atol=1e-4)


def test_weights_past_the_last_level_cache_are_measured_cold(
        specs: list[KernelSpec], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every spec carries the weight bytes of the model's tunable calls; a measurement
    evicts the caches before each timed call only when they exceed the machine's
    last-level cache (in the model each kernel then reads its weights from memory), and
    still checks and times every variant."""
    weights = sum(s.count * sum(o[1].nbytes for o in s.operands if o[0] == "const")
                  for s in specs)
    assert weights > 0 and {s.model_weight_bytes for s in specs} == {weights}
    spec = next(s for s in specs if s.family.startswith("conv"))
    assert evict_bytes(spec) == 0  # tens of KB of weights stay cached

    evicted: list[int] = []
    add = np.add

    def counting_add(a: Any, b: Any, **kw: Any) -> Any:
        if kw.get("out") is a:  # the eviction buffer, written in place
            evicted.append(a.nbytes)
        return add(a, b, **kw)

    monkeypatch.setattr(tune_module, "last_level_cache_bytes", lambda: weights // 2)
    assert evict_bytes(spec) == weights // 2 * 3 // 2
    monkeypatch.setattr(tune_module.np, "add", counting_add)
    monkeypatch.setattr(tune_module, "MORE_BLOCKS", 1)  # the repeats, no more
    lib = build_variant(spec, str(kiln.Target.from_host()), None)["data"]
    out = measure_kernel(spec, [lib, lib], warmup=1, repeats=2, threads=1)
    assert out["equal"] == [True, True] and [len(t) for t in out["times_us"]] == [2, 2]
    # one eviction before each timed call, COLD_CALLS per sample: 2 repeats x 2 variants
    assert evicted == [weights // 2 * 3 // 2 // 4 * 4] * (2 * 2 * tune_module.COLD_CALLS)


@pytest.mark.parametrize("cpu", ["host", "znver4"])
def test_k_segments_of_the_blocked_convolution_compute_the_convolution(cpu: str) -> None:
    """The blocked direct kernel's K-blocking as a knob (`ksegment`: 0 unblocked, or
    input channels per segment): 64 input channels offer 0, 16 and 32 (64 would be one
    segment) but the rule's; each computes onnxruntime's result (an AVX-512 CPU is
    compiled and verified only, unless this host runs it). An illegal one is refused."""
    from kiln.tuning.apply import Forced, using

    host = kiln.Target.from_host()
    target = host if cpu == "host" else kiln.Target(
        f"llvm -mtriple=x86_64-linux-gnu -mcpu={cpu}")
    runs = cpu == "host" or "+avx512f" in [str(f) for f in host.export().get("mattr", ())]
    b = GraphBuilder(14)
    y = b.conv("x", 64, 16, 3)
    model = b.model([value_info("x", [1, 64, 6, 9])], [value_info(y, [1, 16, 6, 9])], 17,
                    "segments")
    (spec,) = [s for s in discover(model, target) if s.family == "conv_direct"]
    offered = sorted(c["ksegment"] for c in spec.candidates if "ksegment" in c)
    assert set(offered) < {0, 16, 32} and len(offered) == 2
    x = np.random.default_rng(2).standard_normal((1, 64, 6, 9)).astype(np.float32)
    (want,) = onnxruntime_outputs(model, {"x": x})
    for k in offered:
        with using(Forced(spec.family, {**spec.default, "ksegment": k})):
            ex = kiln.compile(model, target)
        if runs:
            np.testing.assert_allclose(np.asarray(ex(x)), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(UsageError, match="ksegment"), \
            using(Forced(spec.family, {**spec.default, "ksegment": 48})):
        kiln.compile(model, target)
