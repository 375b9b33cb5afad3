"""Scripts written for onnxruntime run on kiln by changing their import only, in a
fresh interpreter.

The compatibility scripts (compat_scripts.py, compared in-process by
test_ort_compat.py) of one session's life are run again here in fresh processes, once
with `import onnxruntime as rt` and once with `import kiln as rt`: what each returns
and whether each raises must agree.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from compat_scripts import REASONS, SCRIPTS
from compat_table import same_values, write_mlp

from support.processes import run_python

HERE = Path(__file__).resolve().parent
# The scripts of one session's life: open, describe, run, bind, fail.
PICKED = ["session_from_path", "session_metadata", "output_names_subset", "options_threads",
          "io_binding_buffers", "io_binding_ortvalues", "run_with_ort_values",
          "feed_float_list", "feed_wrong_dtype", "feed_wrong_rank", "feed_missing_input",
          "run_options_terminate"]

CHILD = '''
import importlib, pickle, sys, tempfile
from pathlib import Path
from compat_table import run
rt = importlib.import_module(sys.argv[1])
out = {}
for name in sys.argv[4:]:
    done = run(rt, name, Path(sys.argv[2]))
    out[name] = ("raised", None) if done.error is not None else ("ran", done.value)
Path(sys.argv[3]).write_bytes(pickle.dumps(out))
'''


def _run(module: str, model: Path, out: Path) -> dict[str, tuple[str, object]]:
    done = run_python(CHILD, module, str(model), str(out), *PICKED, paths=(HERE,))
    assert done.returncode == 0, done.stderr
    result: dict[str, tuple[str, object]] = pickle.loads(out.read_bytes())
    return result


def test_onnxruntime_scripts_run_on_kiln_in_a_fresh_process(tmp_path: Path) -> None:
    assert set(PICKED) <= set(SCRIPTS) and not set(PICKED) & set(REASONS)
    model = write_mlp(tmp_path / "compat_mlp.onnx")
    want = _run("onnxruntime", model, tmp_path / "ort.pickle")
    got = _run("kiln", model, tmp_path / "kiln.pickle")
    for name in PICKED:
        assert got[name][0] == want[name][0], (name, got[name], want[name])
        assert same_values(got[name][1], want[name][1]), (name, got[name], want[name])
    inputs, outputs, _ = got["session_from_path"][1]  # type: ignore[misc]
    assert inputs == [["x", ["batch", 8], "tensor(float)"]]
    assert outputs == [["y", ["batch", 4], "tensor(float)"], ["s", [2], "tensor(int64)"]]
    assert got["feed_wrong_dtype"][0] == "raised"
