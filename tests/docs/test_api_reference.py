"""The API reference (`make docs`, pdoc) documents the public names from their docstrings."""

from __future__ import annotations

import html
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import kiln
import kiln.export
import kiln.frontend
import kiln.runtime

ROOT = Path(__file__).resolve().parents[2]

# page -> the public objects it must document, by the name pdoc gives them.
PUBLIC = {
    "kiln.html": {"compile": kiln.compile, "Executable": kiln.Executable,
                  "Executable.export_library": kiln.Executable.export_library,
                  "Executable.jit": kiln.Executable.jit, "Target": kiln.Target,
                  "Target.from_host": kiln.Target.from_host, "IRModule": kiln.IRModule,
                  "export_model_library_format": kiln.export_model_library_format,
                  "KilnError": kiln.KilnError},
    "kiln/runtime.html": {"load_module": kiln.runtime.load_module,
                          "include_dir": kiln.runtime.include_dir},
    "kiln/frontend.html": {"from_onnx": kiln.frontend.from_onnx},
    "kiln/export.html": {"export_library": kiln.export.export_library},
}


def _first_line(obj: object) -> str:
    doc = inspect.getdoc(obj)
    assert doc, f"{obj!r} has no docstring"
    return doc.splitlines()[0]


def test_pdoc_documents_the_public_names(tmp_path: Path) -> None:
    out = tmp_path / "api"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "pdoc", "-o", str(out), "kiln"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for page, names in PUBLIC.items():
        text = (out / page).read_text()
        # Prose as pdoc renders it: tags dropped, entities decoded, whitespace collapsed.
        prose = " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).split())
        for name, obj in names.items():
            assert f'id="{name}"' in text, f"{page} does not document {name}"
            assert " ".join(_first_line(obj).replace("`", "").split()) in prose, \
                f"{page}: the docstring of {name} is missing"
