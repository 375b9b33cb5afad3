"""CBLAS or kiln's own GEMM, per product, as a tuning choice (kiln.ops.cblas.LIBRARY_CHOICE):
offered only where the target's `libs` list `cblas`, recorded by `kiln tune`, applied by a
tuned compile (the graph holds `cblas_matmul` for the products that chose the library and
kiln's packed GEMM for the others), with the untuned result."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.cli.main import main
from kiln.distributed.model_tuning import model_choices
from kiln.distributed.tune import KernelSpec, build_variant, discover, kernel_module
from kiln.errors import UsageError
from kiln.ops.cblas import LIBRARY_CHOICE, NAME
from kiln.target.isa import isa_for
from kiln.tuning import Measurement, Record, TuningDatabase, target_key
from kiln.tuning.apply import Chosen, Forced, using
from support.graphs import GraphBuilder
from support.reference import ort_session

HAS_OPENBLAS = subprocess.run(
    ["sh", "-c", "echo 'int main(void){return 0;}' | cc -x c - -lopenblas -o /dev/null"],
    capture_output=True).returncode == 0
needs_openblas = pytest.mark.skipif(not HAS_OPENBLAS,
                                    reason="needs libopenblas-dev (make test installs it)")
OWN = {"library": "own"}
CBLAS = {"library": "cblas"}


@pytest.fixture(scope="module")
def mlp() -> onnx.ModelProto:
    """Two dense layers of distinct shapes: [1, 256] @ [256, 256], relu, @ [256, 64]."""
    rng = np.random.default_rng(28)
    b = GraphBuilder()
    b.node("MatMul", ["x", "w1"], ["h"])
    b.node("Relu", ["h"], ["r"])
    b.node("MatMul", ["r", "w2"], ["y"])
    b.consts({"w1": rng.standard_normal((256, 256)).astype(np.float32) / 16,
              "w2": rng.standard_normal((256, 64)).astype(np.float32) / 16})
    b.input("x", [1, 256])
    b.output("y", [1, 64])
    return b.model(name="mlp")


def _host_cblas() -> kiln.Target:
    return kiln.Target.from_host().with_attrs(libs=["cblas"])


def _kernels(mod: Any, target: kiln.Target) -> list[str]:
    """Per product, in order, after the graph pipeline: `cblas` when its kernel calls
    CBLAS (`cblas_matmul`, fused or not), `own` when it is kiln's GEMM (`matmul_packed`
    or `matmul_gemv`), read from the module's DSL text."""
    from kiln.transform.pipeline import get_pipeline

    with target:
        text = get_pipeline("default", "graph", target=target)(mod).script()
    called = re.findall(r'T\.call_func\("(\w+)"', text)
    return ["cblas" if NAME in f else "own" for f in called if "matmul" in f]


def test_discover_offers_the_library_only_where_libs_allow_it(mlp: onnx.ModelProto) -> None:
    found = discover(mlp, _host_cblas())
    choices = [s for s in found if s.family == NAME]
    assert [s.signature for s in choices] == [
        "matmul(float32[1,256];const float32[256,256])",
        "matmul(float32[1,256];const float32[256,64])"]
    assert all(s.default == CBLAS and s.candidates == (OWN,) and s.count == 1
               for s in choices)
    # without the library, no such choice: the products are kiln's, their tiles tunable
    plain = discover(mlp, kiln.Target.from_host())
    assert plain and all(s.family != NAME and "library" not in json.dumps(s.candidates)
                         for s in plain)
    # with it, kiln's kernels of the same products stay in the space (taken when the
    # library choice is "own")
    def summary(specs: list[KernelSpec]) -> list[tuple[Any, ...]]:
        return [(s.family, s.signature, s.count, s.default, s.candidates,
                 s.model_weight_bytes) for s in specs]

    assert summary([s for s in found if s.family != NAME]) == summary(plain)
    assert {s.signature for s in plain} == {s.signature for s in choices}


def test_chosen_params_pick_the_library_per_product(mlp: onnx.ModelProto) -> None:
    mod = kiln.frontend.from_onnx(mlp)
    target = _host_cblas()
    first, second = (s.signature for s in discover(mlp, target) if s.family == NAME)
    cases = {(): ["cblas", "cblas"], ((NAME, first),): ["own", "cblas"],
             ((NAME, second),): ["cblas", "own"], ((NAME, first), (NAME, second)): ["own", "own"]}
    for own, want in cases.items():
        with using(Chosen(dict.fromkeys(own, OWN))):
            assert _kernels(mod, target) == want, own
    # without the library in `libs`, the session is not asked: kiln's kernels
    with using(Chosen({(NAME, first): CBLAS, (NAME, second): CBLAS})):
        assert _kernels(mod, kiln.Target.from_host()) == ["own", "own"]
    with using(Chosen({(NAME, first): {"library": "mkl"}})), \
            pytest.raises(UsageError, match=r"cblas_matmul params .*'library': one of 'cblas', "
                                            r"'own'"):
        _kernels(mod, target)


@needs_openblas
def test_a_database_applies_the_choice_with_the_untuned_result(
        mlp: onnx.ModelProto, tmp_path: Path) -> None:
    target = _host_cblas()
    key = target_key(isa_for(target))
    found = discover(mlp, target)
    first, second = (s for s in found if s.family == NAME)
    gemms = [s for s in found if s.family != NAME]

    def faster(spec: KernelSpec, params: dict[str, Any], us: float) -> Record:
        return Record(spec.family, spec.signature, key, Measurement(spec.default, (100.0,) * 5),
                      [Measurement(params, (us, us + 1, us - 1, us, us), True, (100.0,) * 5)])

    # recorded timings in which kiln's own kernel is twice as fast for the first product,
    # the library for the second (its candidate slower: no choice); a tile of kiln's
    # kernel is faster for both, but only the product left to kiln's kernel takes it
    tiles = {s.signature: s.candidates[0] for s in gemms}
    db = TuningDatabase([faster(first, OWN, 50.0), faster(second, OWN, 150.0),
                         *(faster(s, tiles[s.signature], 50.0) for s in gemms)])
    # the whole-model check is offered only choices that can change the model: not the
    # tile of the product that stays on the library
    offered = {(c.kernel, c.signature) for c in model_choices(db, found, key)}
    assert offered == {(NAME, first.signature), (gemms[0].family, first.signature)}
    with pytest.warns(UserWarning, match="2 tuned kernel.* not checked in this model"):
        tuned = kiln.compile(mlp, target, tuning=db)
    script = tuned.ir.script()
    assert script.count("cblas_matmul") >= 1 and "matmul_packed" in script
    assert tuned.metadata["tuning"]["kernels"] == {
        f"{NAME} {first.signature}": OWN,
        f"{gemms[0].family} {first.signature}": tiles[first.signature]}
    assert tuned.metadata["external_dependencies"][0]["short_name"] == "cblas"
    onnx.save(mlp, tmp_path / "mlp.onnx")
    x = np.random.default_rng(5).standard_normal((1, 256)).astype(np.float32)
    want = ort_session(tmp_path / "mlp.onnx").run(None, {"x": x})[0]
    untuned = kiln.compile(mlp, target)
    assert "matmul_packed" not in untuned.ir.script()
    np.testing.assert_allclose(tuned.jit()["main"](x), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(untuned.jit()["main"](x), want, rtol=1e-4, atol=1e-4)


def test_a_variant_builds_the_one_product_it_chooses_for(mlp: onnx.ModelProto) -> None:
    found = discover(mlp, _host_cblas())
    spec: KernelSpec = next(s for s in found if s.family == NAME)
    forced = Forced(NAME, OWN)
    with using(forced):
        assert _kernels(kernel_module(spec), _host_cblas()) == ["own"]
    assert forced.seen == 1
    with using(Forced(NAME, None)):
        assert _kernels(kernel_module(spec), _host_cblas()) == ["cblas"]
    # a tile of kiln's kernel of that product, built on the target with the library:
    # the library choice leaves the product to the family being built
    gemm = next(s for s in found if s.family != NAME and s.signature == spec.signature)
    forced = Forced(gemm.family, gemm.candidates[0])
    with using(forced):
        assert _kernels(kernel_module(gemm), _host_cblas()) == ["own"]
    assert forced.seen == 1
    if HAS_OPENBLAS:
        assert build_variant(spec, str(_host_cblas()), OWN)["data"]
        assert build_variant(gemm, str(_host_cblas()), gemm.candidates[0])["data"]
    assert LIBRARY_CHOICE.calls_library(None) and not LIBRARY_CHOICE.calls_library(OWN)


@needs_openblas
def test_kiln_tune_records_the_library_choice(
        mlp: onnx.ModelProto, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, db_path = tmp_path / "mlp.onnx", tmp_path / "mlp.tuning.json"
    onnx.save(mlp, model)
    target = _host_cblas()
    assert main(["tune", str(model), "--target", str(target), "--budget", "4s",
                 "-o", str(db_path), "--in-process", "--threads", "1"]) == 0
    print(capsys.readouterr().out)
    db = TuningDatabase.load(db_path)
    records = [r for r in db.records() if r.kernel == NAME]
    assert records, "no record of the library choice"
    for r in records:
        assert r.default.params == CBLAS and r.default.times_us
        assert [c.params for c in r.candidates] == [OWN] and r.candidates[0].equal
    # whatever was chosen, the tuned build computes the product
    lib = kiln.compile(model, target, tuning=db).jit()
    x = np.random.default_rng(6).standard_normal((1, 256)).astype(np.float32)
    want = ort_session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(lib["main"](x), want, rtol=1e-4, atol=1e-4)
