"""bench/peers_table.py: the rows of bench/peers.py's tables from its measurements.

The tables in docs/performance.md are only as good as the arithmetic behind them: the
geometric mean leaves out the int8 rows and counts each column's own models, and a
runtime that is not installed, has no torch module or failed says so in its cell
instead of showing a number.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def peers() -> ModuleType:
    """bench/peers_table.py, loaded from its file (bench/ is scripts, not a package)."""
    name = "kiln_bench_peers_table"
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "peers_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass resolves its annotations through it
    spec.loader.exec_module(module)
    return module


def _result(peers: ModuleType, model: str, ratios: dict[str, float], int8: bool = False,
            missing: dict[str, str] | None = None) -> object:
    return peers.PeerResult(model, int8=int8, ort_ms=2.0, ratio={"ort": 1.0, **ratios},
                            rel_l2={"ort": 0.0, **dict.fromkeys(ratios, 3e-7)},
                            compile_s={"ort": 0.1, **dict.fromkeys(ratios, 1.5)},
                            missing=missing or {})


def test_geomean(peers: ModuleType) -> None:
    assert peers.geomean([0.5, 2.0, 1.0]) == pytest.approx(1.0)
    assert peers.geomean([0.25, 1.0]) == pytest.approx(0.5)
    assert math.isnan(peers.geomean([]))


def test_rows_name_absent_and_failed_runtimes(peers: ModuleType) -> None:
    runtimes = ["kiln", "ort", "ov_f32", "torch"]
    r = _result(peers, "vit", {"kiln": 0.93}, missing={"ov_f32": "absent", "torch": "—"})
    assert peers.latency_header(runtimes) == [
        "model", "ort ms", "kiln / ort (rel L2)", "OpenVINO fp32 / ort (rel L2)",
        "torch eager / ort (rel L2)"]
    assert peers.latency_row(r, runtimes) == ["vit", "2", "0.93x (3e-07)", "absent", "—"]
    assert peers.compile_header(runtimes) == [
        "model", "kiln cold compile s", "ort session s", "OV fp32 compile_model s"]
    assert peers.compile_row(r, runtimes) == ["vit", "1.50", "0.10", "absent"]
    q = _result(peers, "resnet50", {"kiln": 0.7}, int8=True)
    q.rel_l2["kiln"] = 0.0
    assert peers.latency_row(q, runtimes)[:3] == ["resnet50 (int8)", "2", "0.70x (0)"]
    q.ort_ms = 1284.4
    assert peers.latency_row(q, runtimes)[1] == "1284"


def test_geomean_row_leaves_out_int8_and_counts_each_column(peers: ModuleType) -> None:
    runtimes = ["kiln", "ort", "ov_f32", "torch"]
    results = [
        _result(peers, "a", {"kiln": 0.5, "ov_f32": 1.0}, missing={"torch": "—"}),
        _result(peers, "b", {"kiln": 2.0}, missing={"ov_f32": "failed", "torch": "—"}),
        _result(peers, "c", {"kiln": 0.1, "ov_f32": 0.1}, int8=True),
    ]
    assert peers.geomean_row(results, runtimes) == [
        "geomean, 2 float models", "", "**1.00x**", "**1.00x** (1 of 2)", "—"]
    absent = [_result(peers, "a", {"kiln": 0.5}, missing={"ov_f32": "absent"})]
    assert peers.geomean_row(absent, runtimes)[3] == "absent"
