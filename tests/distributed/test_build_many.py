"""`kiln build-many`: a models x targets matrix built as tasks, in this process and on
a real 2-node Ray cluster (two raylets on this machine), each file checked by loading
it and comparing with onnxruntime."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.cli.main import main
from kiln.distributed import load_matrix
from kiln.distributed.build import build_cell, cell_suffix
from kiln.distributed.executor import InProcessExecutor, make_executor
from kiln.distributed.tune import measure_resource
from kiln.errors import MissingFileError, UsageError
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

RNG = np.random.default_rng(7)


def _mlp(path: Path) -> None:
    b = GraphBuilder()
    b.const(RNG.standard_normal((16, 8)).astype(np.float32), name="w")
    b.node("MatMul", ["x", "w"], ["m"])
    b.node("Relu", ["m"], ["y"])
    b.input("x", [2, 16])
    b.output("y", [2, 8])
    onnx.save(b.model(name="mlp", ir_version=None), path)


def _conv(path: Path) -> None:
    b = GraphBuilder()
    b.const(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), name="w")
    b.node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    b.node("Sigmoid", ["c"], ["y"])
    b.input("x", ["n", 3, 8, 8])
    b.output("y", ["n", 4, 8, 8])
    onnx.save(b.model(name="conv", ir_version=None), path)


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    _mlp(tmp_path / "models" / "mlp.onnx")
    _conv(tmp_path / "models" / "conv.onnx")
    spec = {"version": 1,
            "models": ["models/mlp.onnx", {"path": "models/conv.onnx", "shape": {"n": 2}}],
            "targets": ["host", "c", "no-such-kind"]}
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(spec))
    return path


def _check_outputs(out: Path, models: Path) -> None:
    """Every .so in `out` loads and matches onnxruntime on its model."""
    for lib in sorted(out.glob("*.so")):
        model = models / f"{lib.name.split('--')[0]}.onnx"
        x = RNG.standard_normal((2, 16) if model.stem == "mlp" else (2, 3, 8, 8)
                                ).astype(np.float32)
        want = onnxruntime_outputs(model, {"x": x})[0]
        got = kiln.runtime.load_module(str(lib))["main"](x)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_in_process_builds_every_cell_and_reports_failures(matrix: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    out = tmp_path / "out"
    code = main(["build-many", str(matrix), "-o", str(out), "--in-process"])
    text = capsys.readouterr().out
    assert code == 1  # one target cannot be built: the others are
    assert "4 of 6 cells built" in text and "FAILED mlp for no-such-kind: TargetError" in text
    assert sorted(p.name for p in out.iterdir()) == [
        "build-summary.json", "conv--c.so", "conv--host.so", "mlp--c.so", "mlp--host.so"]
    summary = json.loads((out / "build-summary.json").read_text())
    assert summary["version"] == 1 and summary["where"]["engine"] == "in-process"
    assert [c["ok"] for c in summary["cells"]] == [True, True, False] * 2
    _check_outputs(out, matrix.parent / "models")


def test_without_ray_the_executor_is_this_process(tmp_path: Path) -> None:
    """With `ray` unimportable, build-many runs in-process; --address is refused."""
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from kiln.distributed.executor import make_executor\n"
        "print(type(make_executor()).__name__)\n"
        "try:\n"
        "    make_executor('auto')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.stdout.splitlines() == [
        "InProcessExecutor",
        "UsageError --address needs Ray: pip install 'kiln-tensor[distributed]'"]


@pytest.mark.parametrize(("spec", "message"), [
    ([], "expected an object"),
    ({"models": [], "targets": ["c"]}, "'models' must be a non-empty list"),
    ({"models": ["m.onnx"], "targets": ["c"], "extra": 1}, "unknown key(s) extra"),
    ({"version": 2, "models": ["m.onnx"], "targets": ["c"]}, "newer than this kiln"),
    ({"models": [{"path": "m.onnx", "shape": {"n": "big"}}], "targets": ["c"]}, "'shape'"),
    ({"models": ["m.onnx"], "targets": [3]}, "targets[0]"),
    ({"models": ["m.onnx", "sub/m.onnx"], "targets": ["c"]}, "two models named m"),
])
def test_bad_matrices_are_usage_errors(tmp_path: Path, spec: object, message: str) -> None:
    (tmp_path / "sub").mkdir()
    for p in (tmp_path / "m.onnx", tmp_path / "sub" / "m.onnx"):
        _mlp(p)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(UsageError, match=re.escape(message)):
        load_matrix(path)


def test_missing_files_and_yaml(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError):
        load_matrix(tmp_path / "none.json")
    (tmp_path / "m.yaml").write_text("models: [gone.onnx]\ntargets: [c]\n")
    pytest.importorskip("yaml")
    with pytest.raises(MissingFileError, match=re.escape("gone.onnx")):
        load_matrix(tmp_path / "m.yaml")
    _mlp(tmp_path / "gone.onnx")
    matrix = load_matrix(tmp_path / "m.yaml")
    assert [m.name for m in matrix.models] == ["gone"] and matrix.targets == ("c",)


def test_one_cells_failure_does_not_stop_the_others() -> None:
    def task(n: int) -> int:
        if n == 1:
            raise UsageError("bad cell\nsecond line")
        return n * 10

    outcomes = InProcessExecutor().run(task, [(0,), (1,), (2,)])
    assert [o.value for o in outcomes] == [0, None, 20]
    assert outcomes[1].error == "UsageError: bad cell"


def _wait_for_port(port: int) -> None:
    """Wait until the head's GCS accepts connections on 127.0.0.1:`port` (2 minutes at
    most): a socket per try, where a `ray status` poll is a Python process importing Ray."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.2)
    pytest.fail(f"the Ray head did not listen on port {port}")


def _wait_for_nodes(ray_bin: Path, head: str, count: int, env: dict[str, str]) -> None:
    """Poll `ray status` until `count` nodes are up (2 minutes at most)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        proc = subprocess.run([str(ray_bin), "status", f"--address={head}"],
                              capture_output=True, text=True, env=env, timeout=60)
        if proc.returncode == 0 and proc.stdout.count(" node_") >= count:
            return
        time.sleep(1)
    pytest.fail(f"the Ray cluster at {head} did not reach {count} node(s): {proc.stdout[-1500:]}"
                f"{proc.stderr[-1500:]}")


@pytest.mark.slow
def test_two_node_ray_cluster(matrix: Path, tmp_path: Path) -> None:
    """`ray start --head` plus a second raylet joining it, each with its own resources;
    build-many joins with --address and the summary names both nodes. Then `kiln tune`
    on the same cluster: only the head offers this CPU's measurement resource, so every
    measurement runs there while builds may run on either node."""
    pytest.importorskip("ray")
    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        pytest.skip("the `ray` command is not installed next to this Python")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), RAY_AUTH_MODE="disabled",
               RAY_USAGE_STATS_ENABLED="0", KILN_NUM_THREADS="1",
               # workers at the priority of the suite, not niceness 15 (docs/distributed.md)
               RAY_worker_niceness="0")
    port = 20000 + os.getpid() % 20000
    head = f"127.0.0.1:{port}"
    # Ray's unix sockets live under --temp-dir, whose path must stay short (108 bytes)
    temp = Path(tempfile.mkdtemp(prefix="kiln-ray-", dir="/tmp"))
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats",
              "--block"]
    # --block keeps each node's processes under one process group that the test owns:
    # stopping them never touches another Ray instance on this machine (`ray stop` would)
    measures = measure_resource(kiln.Target.from_host())
    raylets = [subprocess.Popen([str(ray_bin), "start", "--head", f"--port={port}",
                               f'--resources={{"kiln_a": 1, "{measures}": 1}}',
                               "--include-dashboard=false",
                               f"--temp-dir={temp}", *common], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        _wait_for_port(port)  # the second node joins through the head's GCS
        raylets.append(subprocess.Popen([str(ray_bin), "start", f"--address={head}",
                                       '--resources={"kiln_b": 1}', *common], env=env,
                                      start_new_session=True, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        _wait_for_nodes(ray_bin, head, 2, env)
        out = tmp_path / "out"
        proc = subprocess.run([sys.executable, "-m", "kiln", "build-many", str(matrix),
                               "-o", str(out), "--address", head,
                               "--cache-dir", str(tmp_path / "shared-cache")],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
        assert "4 of 6 cells built" in proc.stdout
        assert "ran on: ray at 127.0.0.1" in proc.stdout and "2 node(s)" in proc.stdout
        summary = json.loads((out / "build-summary.json").read_text())
        nodes = {n["id"] for n in summary["where"]["nodes"]}
        assert len(nodes) == 2
        assert {"kiln_a", "kiln_b"} <= {r for n in summary["where"]["nodes"]
                                        for r in n["resources"]}
        built = [c for c in summary["cells"] if c["ok"]]
        assert {c["node"] for c in built} <= nodes
        print(f"\ncells per node: {sorted(Counter(c['node'][:8] for c in built).items())}")
        assert any((tmp_path / "shared-cache").rglob("*")), "the shared cache stayed empty"
        _check_outputs(out, matrix.parent / "models")

        from kiln.tuning import TuningDatabase

        head_node = next(n["id"] for n in summary["where"]["nodes"]
                         if measures in n["resources"])
        db = tmp_path / "conv.tuning.json"
        proc = subprocess.run([sys.executable, "-m", "kiln", "tune",
                               str(matrix.parent / "models" / "conv.onnx"), "--shape", "n=1",
                               "--budget", "8s", "-o", str(db), "--address", head,
                               "--threads", "1"],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        print(proc.stdout)
        assert f"running on: ray at {head}, 2 node(s)" in proc.stdout
        assert f"measurements on: {head_node[:12]}\n" in proc.stdout
        records = TuningDatabase.load(db).records()
        # conv_direct or conv_rows: the rule picks the family from the host's ISA (a
        # budget with time left measures model knobs too)
        assert any(getattr(r, "kernel", "").startswith("conv_") and r.candidates
                   for r in records), records
    finally:
        _stop(raylets)
        shutil.rmtree(temp, ignore_errors=True)


def _stop(raylets: list[subprocess.Popen[bytes]], grace_s: float = 2) -> None:
    """Stop each node's process group: SIGTERM to all at once, SIGKILL to what is left
    after `grace_s`. A head's `ray start --block` takes 20-35 s to wind down on SIGTERM
    (most of this test's time when it waited for it); what the test checks is done by
    then, and the head's state dies with its processes (its --temp-dir is removed)."""
    for raylet in raylets:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(raylet.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for raylet in raylets:
        try:
            raylet.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(raylet.pid, signal.SIGKILL)
            raylet.wait()


def test_make_executor_in_process_flag() -> None:
    assert isinstance(make_executor(in_process=True), InProcessExecutor)


def test_a_cell_writes_the_suffix_kiln_compile_writes() -> None:
    """A cross target with an OS is a `.so`, as `kiln compile -o model.so` makes it."""
    assert cell_suffix("x86_64-unknown-linux-gnu") == ".so"
    assert cell_suffix("aarch64-unknown-linux-gnu") == ".so"
    assert cell_suffix("armv7a-linux-gnueabihf") == ".so"
    assert cell_suffix("thumbv7em-none-eabi") == ".tar"
    assert cell_suffix("wasm32-unknown-unknown") == ".wasm"


def test_an_aarch64_cell_is_a_shared_library(tmp_path: Path) -> None:
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("aarch64-linux-gnu-gcc (gcc-aarch64-linux-gnu) is not installed")
    _mlp(tmp_path / "mlp.onnx")
    cell = build_cell((tmp_path / "mlp.onnx").read_bytes(), {},
                      "llvm -mtriple=aarch64-linux-gnu", None)
    assert cell["suffix"] == ".so"
    assert cell["data"][:4] == b"\x7fELF" and cell["data"][18] == 183  # e_machine AArch64
