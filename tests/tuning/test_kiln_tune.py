"""`kiln tune` in this process on a one-convolution model with a short budget, then
`kiln compile --tuning` with its database and `kiln inspect` naming it."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import kiln
from kiln.artifact import load_with_metadata
from kiln.cli.main import main
from kiln.distributed.tune import MORE_BLOCKS, REPEATS
from kiln.driver.fingerprint import module_fingerprint
from kiln.frontend import from_onnx
from kiln.target.isa import isa_for
from kiln.tuning import TuningDatabase, target_key
from kiln.tuning.apply import MODEL_KNOBS
from support.graphs import GraphBuilder, value_info


def _conv_model(path: Path) -> None:
    b = GraphBuilder(5)
    y = b.op("Relu", b.conv("x", 40, 16, 3))
    onnx.save(b.model([value_info("x", [1, 40, 4, 8])], [value_info(y, [1, 16, 4, 8])], 17,
                      "conv"), path)


def test_kiln_tune_in_process_then_compile_with_its_database(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, db_path = tmp_path / "conv.onnx", tmp_path / "conv.tuning.json"
    _conv_model(model)
    assert main(["tune", str(model), "--budget", "3s", "-o", str(db_path), "--in-process",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "running on: in-process" in out and "builds ran on: local" in out
    db = TuningDatabase.load(db_path)
    # the kernel's record (the model-level knobs' records aside: tests/tuning/test_model_knobs.py)
    (record,) = [r for r in db.records() if r.kernel not in MODEL_KNOBS]
    assert record.kernel == "conv_direct" and record.signature.startswith("conv2d(float32[1,40")
    assert record.target == target_key(isa_for(kiln.Target.from_host()))
    # each candidate is measured in one task, for the repeats or more blocks while its
    # verdict is open, paired with the default's samples of those blocks; the default in
    # every task that measured one of its candidates (its samples pooled)
    assert record.candidates and all(
        REPEATS <= len(c.times_us) == len(c.default_us) <= MORE_BLOCKS * REPEATS
        for c in record.candidates)
    assert len(record.default.times_us) >= REPEATS
    assert all(c.equal for c in record.candidates)
    # the whole-model check ran on the model (1 thread) and recorded its verdict: what
    # a compile of this model applies (no warning: filterwarnings makes one an error)
    assert "model check: " in out
    (verdict,) = db.verdicts()
    assert verdict.model == module_fingerprint(from_onnx(str(model)))
    assert verdict.target == record.target and verdict.threads == 1
    assert {c.key for c in (*verdict.accepted, *verdict.rejected)} == (
        {(record.kernel, record.signature)} if record.chosen else set())
    assert len(verdict.untuned_us) == len(verdict.tuned_us) >= (
        REPEATS if record.chosen else 0)

    lib = tmp_path / "conv.so"
    assert main(["compile", str(model), "--tuning", str(db_path), "-o", str(lib)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(lib)]) == 0
    shown = capsys.readouterr().out
    assert f"tuning:   database sha256 {db.fingerprint()}" in shown
    assert "checked in this model" in shown and "not checked" not in shown
    assert load_with_metadata(str(lib))[1]["tuning"]["checked_in_model"] is True
    db_path.write_text("{not json")
    assert main(["compile", str(model), "--tuning", str(db_path), "-o", str(lib)]) == 2
    assert "not JSON" in capsys.readouterr().err
