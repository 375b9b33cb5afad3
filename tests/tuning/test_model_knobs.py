"""The model-level knobs of `kiln tune` (docs/tuning.md, "Model-level knobs"): NCHWc on
or off per region (kiln.transform.nchwc_layout, pseudo-kernel `nchwc_region`) and the
parallel work threshold (kiln.kernels.parallel_work, `parallel_threshold`): the pass
asks the session per region, forcing a region either way or moving the threshold keeps
the results equal to onnxruntime's, recorded model timings give the expected records
and verdict, and an end-to-end `kiln tune` records and applies them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from test_tuning_apply import parallel_kernels

import kiln
from kiln.distributed import model_tuning
from kiln.distributed.model_tuning import (
    Choice,
    check_model,
    measure_knobs,
    model_choices,
    tune_model,
)
from kiln.distributed.tune import ModelKnob
from kiln.driver.fingerprint import module_fingerprint
from kiln.frontend import from_onnx
from kiln.kernels import parallel_work
from kiln.kernels.parallel_work import PARALLEL_MIN_NS
from kiln.target.isa import isa_for
from kiln.transform.pipeline import get_pipeline
from kiln.tuning import TuningDatabase, target_key
from kiln.tuning.apply import NCHWC_REGION, PARALLEL_THRESHOLD, Chosen, Recorder, using
from kiln.tuning.database import Checked, Verdict
from support.graphs import GraphBuilder, value_info
from support.reference import onnxruntime_outputs

C, H = 16, 6
MATMUL_MADDS = 4 * 256 * 64


def _model() -> onnx.ModelProto:
    """Two regions: `x` through two 3x3 convolutions with a padded max pool between and a
    residual add (two convolutions, no more than its two reorders in and out: NCHW by
    rule), `y` through a 1x1, a depthwise 3x3 and a 1x1 (a MobileNet block: NCHWc by
    rule)."""
    b = GraphBuilder(7)
    a = b.op("Relu", b.conv("x", C, C, 3))
    r = b.op("Add", b.op("Relu", b.conv(_padded_pool(b, a), C, C, 3)), a)
    p = b.op("Relu", b.conv("y", C, 2 * C, 1))
    d = b.op("Relu", b.conv(p, 2 * C, 2 * C, 3, group=2 * C))
    v = b.conv(d, 2 * C, C, 1)
    # and a product of MATMUL_MADDS multiply-adds (~2.7 us on AVX2, ~1.4 on AVX-512):
    # parallel only under a threshold below the rule's 5 us
    m = b.op("MatMul", "z", b.const(b.rng.normal(0, 0.1, (256, 64)).astype(np.float32)))
    return b.model([value_info("x", [1, C, H, H]), value_info("y", [1, C, H, H]),
                    value_info("z", [4, 256])],
                   [value_info(r, [1, C, H, H]), value_info(v, [1, C, H, H]),
                    value_info(m, [4, 64])], 17, "knobs")


def _padded_pool(b: GraphBuilder, x: str) -> str:
    """A 3x3 stride-1 max pool padded by one (its windows clipped at the border)."""
    return b.op("MaxPool", x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])


MODEL = _model()
_RNG = np.random.default_rng(3)
FEEDS = {"x": _RNG.standard_normal((1, C, H, H)).astype(np.float32),
         "y": _RNG.standard_normal((1, C, H, H)).astype(np.float32),
         "z": _RNG.standard_normal((4, 256)).astype(np.float32)}


def _regions() -> dict[str, str]:
    """The regions the pass asks for (signature -> the rule's layout)."""
    recorder = Recorder()
    tgt = kiln.Target.from_host()
    with tgt, using(recorder):
        get_pipeline("default", "graph", target=tgt)(from_onnx(MODEL))
    return {sig: p["layout"] for (kernel, sig), p in recorder.knobs.items()
            if kernel == NCHWC_REGION and sig is not None}


def _blocked_ops(session: Any) -> list[str]:
    """The kernels of the graph pipeline's result that run a blocked convolution."""
    tgt = kiln.Target.from_host()
    with tgt, using(session):
        mod = get_pipeline("default", "graph", target=tgt)(from_onnx(MODEL))
    return sorted(n for n in mod.functions if "conv2d_nchwc" in n)


def _run(session: Any) -> tuple[Any, list[np.ndarray]]:
    with using(session):
        ex = kiln.compile(from_onnx(MODEL), kiln.Target.from_host())
    out = ex.jit()["main"](*FEEDS.values())
    return ex, [np.asarray(o) for o in out]


def _needs_blocked_regions() -> None:
    isa = isa_for(kiln.Target.from_host())
    if isa.vector_bits < 256:
        pytest.skip("the default pipeline forms NCHWc regions on AVX2 or AVX-512 hosts only")


@pytest.fixture(scope="module")
def reference() -> list[np.ndarray]:
    return onnxruntime_outputs(MODEL, FEEDS)


def test_the_pass_asks_per_region_and_either_layout_matches_onnxruntime(
        reference: list[np.ndarray]) -> None:
    _needs_blocked_regions()
    regions = _regions()
    assert sorted(regions.values()) == ["NCHW", "NCHWc"], regions
    rule = _blocked_ops(None)
    assert any("depthwise" in n for n in rule) and not any("add" in n for n in rule), rule
    flipped = {(NCHWC_REGION, sig): {"layout": "NCHW" if layout == "NCHWc" else "NCHWc"}
               for sig, layout in regions.items()}
    by_rule = {(NCHWC_REGION, sig): {"layout": layout} for sig, layout in regions.items()}
    assert _blocked_ops(Chosen(by_rule)) == rule
    # flipped: the plain chain blocked (with its residual add), the MobileNet block not
    blocked = _blocked_ops(Chosen(flipped))
    assert any("add" in n for n in blocked) and not any("depthwise" in n for n in blocked)
    all_nchw = {k: {"layout": "NCHW"} for k in flipped}
    assert _blocked_ops(Chosen(all_nchw)) == []
    for params in (flipped, {k: {"layout": "NCHWc"} for k in flipped}, all_nchw):
        _, out = _run(Chosen(params))
        for o, r in zip(out, reference, strict=True):
            np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4)
    with pytest.raises(kiln.errors.UsageError, match="layout must be one of"):
        _blocked_ops(Chosen({k: {"layout": "NHWC"} for k in flipped}))


def test_the_threshold_changes_which_loops_are_parallel(reference: list[np.ndarray]) -> None:
    fp = module_fingerprint(from_onnx(MODEL))
    # below the host's estimate of the model's small product, so that it goes parallel
    # (half of it: 1.4 us on AVX2, 0.7 on AVX-512)
    low = int(parallel_work.work_ns(MATMUL_MADDS, "madd", isa_for(kiln.Target.from_host())) / 2)
    assert low < PARALLEL_MIN_NS
    kernels = {}
    for ns in (low, PARALLEL_MIN_NS, 20_000):
        ex, out = _run(Chosen({(PARALLEL_THRESHOLD, fp): {"min_ns": ns}}, fp))
        kernels[ns] = parallel_kernels(ex)
        for o, r in zip(out, reference, strict=True):
            np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4)
    assert set(kernels[20_000]) <= set(kernels[PARALLEL_MIN_NS]) < set(kernels[low])
    # a threshold signed by another model's fingerprint does not apply
    ex, _ = _run(Chosen({(PARALLEL_THRESHOLD, "other"): {"min_ns": low}}, fp))
    assert parallel_kernels(ex) == kernels[PARALLEL_MIN_NS]
    with pytest.raises(kiln.errors.UsageError, match="min_ns must be a positive integer"):
        _run(Chosen({(PARALLEL_THRESHOLD, fp): {"min_ns": 0}}, fp))


class _Recorded:
    """A model runner replaying recorded model timings: the untuned model takes 1000 us,
    each variant adds `effects[params]` (us), the host drifting 2x over a measurement."""

    def __init__(self, effects: dict[str, float]) -> None:
        self.tgt = kiln.Target.from_host()
        self.effects = effects
        self.built: list[tuple[str, ...]] = []

    def build(self, choices: tuple[Choice, ...]) -> frozenset[str]:
        names = tuple(sorted(str(c.params) for c in choices))
        self.built.append(names)
        return frozenset(names)

    def outputs(self, fn: Any) -> list[np.ndarray]:
        return [np.ones(3, np.float32)]

    def measure(self, a: frozenset[str], b: frozenset[str]) -> tuple[list[float], list[float]]:
        drift = [1 + (i % 5) / 4 for i in range(15)]
        t = {s: 1000.0 + sum(self.effects[k] for k in s) for s in (a, b)}
        return [t[a] * d for d in drift], [t[b] * d for d in drift]


KNOBS = [ModelKnob(NCHWC_REGION, "conv2d(r)", {"layout": "NCHW"}, ({"layout": "NCHWc"},)),
         ModelKnob(PARALLEL_THRESHOLD, "fp", {"min_ns": PARALLEL_MIN_NS},
                   tuple({"min_ns": n} for n in (2_000, 10_000, 20_000)))]


def test_recorded_model_timings_give_the_records_and_the_verdict() -> None:
    effects = {"{'layout': 'NCHWc'}": -60.0, "{'min_ns': 2000}": -40.0,
               "{'min_ns': 10000}": 30.0, "{'min_ns': 20000}": 0.0}
    runner = _Recorded(effects)
    lines: list[str] = []
    records = measure_knobs(KNOBS, runner, 1e9, lines.append,  # type: ignore[arg-type]
                            clock=lambda: 0.0)
    # the untuned build, then one build per variant, round robin over the knobs
    assert runner.built[0] == () and len(runner.built) == 5
    assert runner.built[1:3] == [("{'layout': 'NCHWc'}",), ("{'min_ns': 2000}",)]
    assert [(r.kernel, r.chosen) for r in records] == [
        (NCHWC_REGION, {"layout": "NCHWc"}), (PARALLEL_THRESHOLD, {"min_ns": 2000})]
    assert all(len(c.times_us) == len(c.default_us) == 15 for r in records
               for c in r.candidates)
    assert len(records[1].default.times_us) == 45  # its three measurements pooled
    assert "model knobs: 4 of 4 variant(s) measured in the model" in lines
    db = TuningDatabase(records)
    key = target_key(isa_for(runner.tgt))
    choices = model_choices(db, [], key, KNOBS)
    # the expected saving: the untuned median (1500 us, drifting) x 6 %, then x 4 %
    assert [(c.kernel, round(c.saving)) for c in choices] == [
        (NCHWC_REGION, 90), (PARALLEL_THRESHOLD, 60)]
    check = check_model(choices, runner.build, runner.measure, 1e9,  # type: ignore[arg-type]
                        clock=lambda: 0.0)
    assert [c.kernel for c in check.accepted] == [NCHWC_REGION, PARALLEL_THRESHOLD]
    # in the model together the threshold loses (the region's gain already took it)
    effects["{'min_ns': 2000}"] = 40.0
    check = check_model(choices, runner.build, runner.measure, 1e9,  # type: ignore[arg-type]
                        clock=lambda: 0.0)
    assert [c.kernel for c in check.accepted] == [NCHWC_REGION]
    assert [c.kernel for c, _ in check.rejected] == [PARALLEL_THRESHOLD]


def test_knob_variants_stop_when_the_budget_runs_out() -> None:
    runner = _Recorded({"{'layout': 'NCHWc'}": 0.0, "{'min_ns': 2000}": 0.0,
                        "{'min_ns': 10000}": 0.0, "{'min_ns': 20000}": 0.0})
    ticks = iter(range(100))
    lines: list[str] = []
    records = measure_knobs(KNOBS, runner, 6.5, lines.append,  # type: ignore[arg-type]
                            clock=lambda: float(next(ticks)))
    # a tick per clock reading: the untuned build and each variant take one: two fit
    assert [len(r.candidates) for r in records] == [1, 1]
    assert "model knobs: 2 of 4 variant(s) measured in the model (2 not: the budget ran " \
           "out)" in lines


def test_kiln_tune_records_and_a_compile_applies_model_knobs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_blocked_regions()
    model, db_path = tmp_path / "chain.onnx", tmp_path / "chain.tuning.json"
    b = GraphBuilder(7)  # one region (two convolutions, two reorders: NCHW by rule)
    a = b.op("Relu", b.conv("x", C, C, 3))
    r = b.op("Add", b.op("Relu", b.conv(_padded_pool(b, a), C, C, 3)), a)
    onnx.save(b.model([value_info("x", [1, C, H, H])], [value_info(r, [1, C, H, H])], 17,
                      "chain"), model)
    lines: list[str] = []
    # the budget almost all the knobs' (one other threshold, the region), whose
    # stage ends when they are measured, and few repeats (5 blocks, up to 20 while a
    # verdict is open): even the loaded host measures every variant in a few seconds
    monkeypatch.setattr(model_tuning, "KNOB_SHARE", 0.7)
    monkeypatch.setattr(parallel_work, "THRESHOLD_CHOICES", (2_000,))
    tune_model(str(model), "host", 30.0, db_path, log=lines.append, repeats=5, threads=1)
    out = "\n".join(lines)
    print(out)
    db = TuningDatabase.load(db_path)
    knobs = {r.kernel: r for r in db.records() if r.kernel in (NCHWC_REGION,
                                                                 PARALLEL_THRESHOLD)}
    assert set(knobs) == {NCHWC_REGION, PARALLEL_THRESHOLD}, out
    assert "model knobs: 2 of 2 variant(s) measured in the model" in lines
    fp = module_fingerprint(from_onnx(str(model)))
    assert knobs[PARALLEL_THRESHOLD].signature == fp
    assert all(len(c.times_us) == len(c.default_us) > 0 for r in knobs.values()
               for c in r.candidates)
    # what a compile applies: the verdict's (rewritten here to accept both knobs' variants)
    accepted = tuple(Checked(r.kernel, r.signature, r.candidates[0].params, "test")
                     for r in knobs.values())
    (verdict,) = db.verdicts()
    db.add_verdict(Verdict(verdict.model, verdict.target, verdict.threads, accepted, (),
                           verdict.untuned_us, verdict.tuned_us))
    ex = kiln.compile(str(model), kiln.Target.from_host(), tuning=db)
    assert {k.split(" ")[0] for k in ex.metadata["tuning"]["kernels"]} == {
        NCHWC_REGION, PARALLEL_THRESHOLD}
    assert any("conv2d_nchwc" in n for n in ex.ir.functions)  # the region went NCHWc
