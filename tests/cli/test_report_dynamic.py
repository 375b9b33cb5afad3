"""The report of a library with symbolic dimensions (`batch`, `seq`): its memory plan and
its bytes written are drawn at a representative binding (each variable at the size the
pin hints suggest: batch=1, seq=128) with the formulas beside them, not as an empty
panel of "0 B ... 1 B" and "0 B" for every op; in headless Chromium the memory panel
shows its bars (pixels of a real screenshot)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_report_scale import png_pixels

import kiln
from kiln.cli.report import render_report
from kiln.cli.report_binding import Binding, representative
from support.graphs import GraphBuilder

CHROMIUM = shutil.which("chromium")
RNG = np.random.default_rng(3)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """An MLP block over [batch, seq, 16], compiled once; its report page."""
    tmp = tmp_path_factory.mktemp("dynamic-report")
    b = GraphBuilder()
    b.const(RNG.standard_normal((16, 64)).astype(np.float32), name="w1")
    b.const(RNG.standard_normal((64, 16)).astype(np.float32), name="w2")
    b.node("MatMul", ["x", "w1"], ["h"])
    b.node("Relu", ["h"], ["r"])
    b.node("MatMul", ["r", "w2"], ["m"])
    b.node("Add", ["m", "x"], ["s"])
    b.node("Softmax", ["s"], ["y"], axis=-1)
    b.input("x", ["batch", "seq", 16])
    b.output("y", ["batch", "seq", 16])
    # the metadata export_library writes into the file, without the link
    ex = kiln.compile(kiln.frontend.from_onnx(b.model(name="block")), "llvm")
    html = render_report(ex.metadata, "block.so")
    (tmp / "block.html").write_text(html, encoding="utf-8")
    return tmp / "block.html", html


def test_the_binding_is_the_pin_hints_within_the_bounds() -> None:
    g = {"tensors": [{"shape": ["batch", "seq", 16], "dtype": "float32"},
                     {"shape": ["n"], "dtype": "int8", "offset": "seq*4"}],
         "workspace_bytes": "max(batch, 2)*64"}
    assert representative(g).values == {"batch": 1, "n": 1, "seq": 128}
    bounded = representative(g, [{"name": "seq", "min": 1, "max": 64},
                                 {"name": "batch", "min": 2, "max": None}])
    assert bounded.values == {"batch": 2, "n": 1, "seq": 64}
    binding = Binding({"batch": 2, "seq": 3})
    assert binding.tensor_bytes({"shape": ["batch", "seq", 16], "dtype": "float32"}) == 384
    assert binding.tensor_bytes({"shape": ["batch", "(seq+1)"], "dtype": "float16"}) == 16
    assert binding.tensor_bytes({"shape": ["batch", "k"], "dtype": "float16"}) is None
    assert binding.size("seq*4 + batch") == 14 and binding.size("not a dim!") is None


def test_the_memory_plan_and_bytes_written_at_the_binding(page: tuple[Path, str]) -> None:
    _, html = page
    assert "Symbolic sizes are drawn at batch=1, seq=128" in html
    assert "<th>bytes written at batch=1, seq=128</th>" in html
    # every op type writes bytes at the binding: none shows 0 B
    summary = html.split("<h3>Summary by op type</h3>")[1].split("</table>")[0]
    written = re.findall(r"<tr><td>[a-z_]+</td><td>\d+</td><td>([^<]+)</td>", summary)
    assert written and "0 B" not in written, summary
    # the workspace: its formula and its size there
    head = re.search(r"<h2>main: \d+ kernel calls, workspace ([^,]+) bytes = ([^,]+) at "
                     r"batch=1, seq=128,", html)
    assert head is not None and "seq" in head.group(1), html[:3000]
    # bars, each with its formula and size; the axis goes past a byte
    bars = re.findall(r'<rect class="bar"[^>]*><title>([^<]*)</title>', html)
    assert bars and all(re.search(r"\*4 = [\d.]+ KiB at offset", t) for t in bars), bars
    axis = re.findall(r'text-anchor="end">([^<]+)</text>', html)
    assert axis[0] == "0 B" and axis[-1] == head.group(2), axis


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium (Debian package `chromium`, "
                    "installed by `make test`) is not on PATH")
def test_the_memory_panel_in_chromium(page: tuple[Path, str]) -> None:
    """The page's memory panel (its SVG as the page holds it, alone on a page, since the
    graph's viewport fills the first screen of the whole one) drawn by Chromium: its
    coloured bars are on the screen, where an empty panel is white and grey only."""
    assert CHROMIUM is not None
    path, html = page
    panel = re.search(r'<svg id="memory-main".*?</svg>', html, re.S)
    assert panel is not None
    alone = path.with_name("memory.html")
    alone.write_text(f"<!DOCTYPE html><html><body>{panel.group(0)}</body></html>",
                     encoding="utf-8")
    shot = path.with_name("memory.png")
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--window-size=800,600", "--force-device-scale-factor=0.5",
         f"--user-data-dir={path.parent / 'chromium'}", f"--screenshot={shot}",
         alone.as_uri()], capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    pixels = png_pixels(shot.read_bytes())[..., :3].astype(np.int32)
    coloured = (pixels.max(axis=2) - pixels.min(axis=2)) > 60  # the palette's bars
    assert coloured.mean() > 0.02, coloured.mean()
    rows, cols = np.nonzero(coloured)
    # bars below the axis' top and right of its labels, reaching down the panel
    assert rows.min() >= 5 and cols.min() >= 35 and rows.max() - rows.min() > 100, \
        (rows.min(), rows.max(), cols.min())
