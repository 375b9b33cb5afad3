"""One script, written for onnxruntime, runs on kiln by changing its import only.

The script text is run twice in fresh processes, once importing onnxruntime and once
kiln; what it prints (names, shapes, types, error kinds) and the outputs it saves
must agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from session_model import write_model

SRC = Path(__file__).resolve().parents[2] / "src"

SCRIPT = '''
import json, sys
import numpy as np
import {module} as rt

opts = rt.SessionOptions()
opts.intra_op_num_threads = 1
sess = rt.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
report = {{
    "inputs": [[i.name, i.shape, i.type] for i in sess.get_inputs()],
    "outputs": [[o.name, o.shape, o.type] for o in sess.get_outputs()],
    "producer": sess.get_modelmeta().producer_name,
}}
x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
y, s = sess.run(None, {{"x": x}})
(y2,) = sess.run(["y"], {{"x": x[:2]}})
io = sess.io_binding()
io.bind_cpu_input("x", x)
buf = np.zeros((3, 4), np.float32)
io.bind_output("y", "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
io.bind_output("s")
sess.run_with_iobinding(io)
y3, s3 = io.copy_outputs_to_cpu()
errors = []
for feed in ({{"x": x.astype(np.float64)}}, {{"x": x[0]}}, {{}}):
    try:
        sess.run(None, feed)
        errors.append(None)
    except Exception:
        errors.append("raised")
report["errors"] = errors
print(json.dumps(report))
np.savez(sys.argv[2], y=y, s=s, y2=y2, buf=buf, y3=y3, s3=s3)
'''


def _run(module: str, model: Path, out: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(module=module), str(model),
                           str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_an_onnxruntime_script_runs_on_kiln(tmp_path: Path) -> None:
    model = write_model(tmp_path / "tiny.onnx")
    want = _run("onnxruntime", model, tmp_path / "ort.npz")
    got = _run("kiln", model, tmp_path / "kiln.npz")
    assert got == want
    assert got["inputs"] == [["x", ["batch", 8], "tensor(float)"]]
    assert got["outputs"] == [["y", ["batch", 4], "tensor(float)"], ["s", [2], "tensor(int64)"]]
    ort_out, kiln_out = np.load(tmp_path / "ort.npz"), np.load(tmp_path / "kiln.npz")
    for name in ("y", "s", "y2", "buf", "y3", "s3"):
        np.testing.assert_allclose(kiln_out[name], ort_out[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    assert kiln_out["buf"].any()  # the bound output buffer was written in place
