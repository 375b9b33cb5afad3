"""A tuning database is untrusted input of bounded cost: its size is checked before it
is read, and every record's parameters against their ranges and the kernel's own
variants, each refusal a UsageError naming the record (docs/tuning.md, "The
database"; docs/security.md, "Limits")."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import onnx
import pytest

import kiln
from kiln.errors import FormatError, UsageError
from kiln.target.isa import isa_for
from kiln.tuning import TuningDatabase, target_key
from kiln.tuning.apply import Recorder, using
from support.graphs import GraphBuilder, value_info
from support.processes import run_python

HOST = kiln.Target.from_host()
#: docs/security.md, "Limits": the largest tuning database read.
MAX_DATABASE_BYTES = 64 << 20


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    """One dense layer: one `gemm` kernel call."""
    b = GraphBuilder(0)
    y = b.linear("x", 64, 32)
    return b.model([value_info("x", [4, 64])], [value_info(y, [4, 32])], 17, "dense")


@pytest.fixture(scope="module")
def key(model: onnx.ModelProto) -> tuple[str, str]:
    """(kernel, signature) of the model's one tunable call."""
    recorder = Recorder()
    with using(recorder):
        kiln.compile(model, HOST)
    ((kernel, sig),) = recorder.calls
    return kernel, sig


def _database(path: Path, key: tuple[str, str], params: Any, kernel: str | None = None
              ) -> Path:
    """A database whose one record chooses its candidate `params` (15 pairs, 20 %
    faster, so the selection rule picks it)."""
    default = [100.0] * 15
    record = {"kernel": kernel or key[0], "signature": key[1],
              "target": target_key(isa_for(HOST)),
              "default": {"params": {"tile": [4, 32]}, "times_us": default},
              "candidates": [{"params": params, "times_us": [80.0] * 15,
                              "default_us": default, "equal": True}]}
    path.write_text(json.dumps({"format": "kiln-tuning", "version": 3,
                                "records": [record]}))
    return path


OUT_OF_RANGE = [([2**31, 16], "2147483648"), ([0, 16], "[0, 16]"), ([-1, 16], "[-1, 16]"),
                ("ab", "'ab'"), ([], "[]")]


@pytest.mark.parametrize(("tile", "shown"), OUT_OF_RANGE, ids=[s for _, s in OUT_OF_RANGE])
def test_a_tile_out_of_range_names_the_record(tmp_path: Path, model: onnx.ModelProto,
                                              key: tuple[str, str], tile: Any, shown: str
                                              ) -> None:
    path = _database(tmp_path / "db.json", key, {"tile": tile})
    with pytest.raises(UsageError) as info:
        kiln.compile(model, HOST, tuning=path)
    message = str(info.value)
    assert f"tuning database {path}: records[0].candidates[0].params" in message
    assert "parameter 'tile' must be a list of 1 to 4 integers from 1 to 1024" in message
    assert shown in message


@pytest.mark.parametrize(("params", "kernel", "message"), [
    ({"tile": [1, 16]}, "no_such_kernel", "unknown kernel 'no_such_kernel'; the kernels: "),
    ({"tile": [1, 16], "bogus": 1}, None, "takes no parameter 'bogus'; it takes tile, split"),
    ({"tile": [3, 7]}, None, "tile [3, 7] is not a tile the 'gemm' kernel takes"),
    # (the tiles it lists are the target's: they follow its vector width)
    ({"tile": [1, 16, 2]}, None, "tile [1, 16, 2] is not a tile the 'gemm' kernel takes"),
], ids=["unknown kernel", "unknown parameter", "not a candidate", "wrong length"])
def test_a_record_outside_the_kernels_space_names_the_record(
        tmp_path: Path, model: onnx.ModelProto, key: tuple[str, str], params: Any,
        kernel: str | None, message: str) -> None:
    path = _database(tmp_path / "db.json", key, params, kernel)
    with pytest.raises(UsageError) as info:
        kiln.compile(model, HOST, tuning=path)
    text = str(info.value)
    assert text.startswith(f"tuning database {path}: the record of kernel ")
    assert key[1][:40] in text and message in text


def test_a_legal_candidate_still_applies(tmp_path: Path, model: onnx.ModelProto,
                                         key: tuple[str, str]) -> None:
    path = _database(tmp_path / "db.json", key, {"tile": [1, 16]})
    with pytest.warns(UserWarning, match="not checked in this model"):
        ex = kiln.compile(model, HOST, tuning=path)
    assert list(ex.metadata["tuning"]["kernels"].values()) == [{"tile": [1, 16]}]
    # and the in-range bounds are checked when the file is read, before any compile
    _database(path, key, {"tile": [1, 16], "unroll": 0})
    with pytest.raises(UsageError, match=r"parameter 'unroll' must be an integer from 1"):
        TuningDatabase.load(path)


def test_an_oversized_database_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(MAX_DATABASE_BYTES + 1)  # sparse: its size, no data
    with pytest.raises(FormatError, match=r"holds 64 MiB, more than the 64 MiB"):
        TuningDatabase.load(path)


def test_a_device_is_read_no_further_than_the_limit() -> None:
    """`--tuning /dev/zero` has no size to check: the read stops past the limit (in a
    child held to 2 GiB, so an unbounded read fails fast there)."""
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from kiln.errors import FormatError
        from kiln.tuning import TuningDatabase
        try:
            TuningDatabase.load("/dev/zero")
        except FormatError as exc:
            print("FormatError:", exc)
    """)
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ("FormatError: tuning database /dev/zero goes on past "
                                   'the 64 MiB it may hold (docs/security.md, "Limits")')


@pytest.mark.parametrize("kwargs", [
    {"threads": 0}, {"threads": 100_000}, {"threads": "2"}, {"threads": 1.5},
    {"budget_s": 0.0}, {"budget_s": -5}, {"budget_s": float("nan")}, {"budget_s": "60"},
], ids=lambda kw: "-".join(f"{k}={v!r}" for k, v in kw.items()))
def test_tune_model_checks_its_arguments_before_reading(tmp_path: Path,
                                                        kwargs: dict[str, Any]) -> None:
    """tune_model's `threads` and `budget_s` are checked as the CLI's flags are: a
    KilnError naming the argument, raised before the (missing) model is read."""
    from kiln.distributed.model_tuning import tune_model

    args: dict[str, Any] = {"budget_s": 10.0, **kwargs}
    budget = args.pop("budget_s")
    with pytest.raises(kiln.KilnError, match=r"threads|budget_s"):
        tune_model(tmp_path / "missing.onnx", HOST, budget, tmp_path / "db.json", **args)
    assert not (tmp_path / "db.json").exists()
