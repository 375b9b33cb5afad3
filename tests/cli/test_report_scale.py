"""The report at transformer scale: a 5,000-kernel graph in headless Chromium, kernel times
of a profile on the page, unique tensor names, repeated blocks found and collapsed.

The first screen of the rendered page must hold the summary and the graph (pixels of a
real screenshot, decoded here with zlib and numpy), and a search given in the address
(`?q=`) must mark the box of the kernel searched for in the live DOM.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kiln_cli import ROOT, one_line_error, run_kiln

from kiln.cli.report import render_report
from kiln.cli.report_structure import Repeat, repeated_run, unique_names

CHROMIUM = shutil.which("chromium")
CNN = ROOT / "models" / "tiny_cnn.onnx"
LAYERS, PER_LAYER = 250, 20  # 5,000 kernel calls, as many as a large transformer lowers to
PROBE = 4321  # the kernel call renamed "attention_probe", searched for by name
OPS = ("fused_matmul_packed_add", "reshape", "transpose", "softmax", "layer_norm")


def synthetic_metadata() -> dict[str, Any]:
    """Library metadata whose graph is LAYERS copies of a block of PER_LAYER kernel calls,
    each output named "add" (as lowered ONNX graphs name them), one weight per call."""
    tensors: list[dict[str, Any]] = [{"name": "x", "kind": "input", "shape": [1, 128, 768],
                                      "dtype": "float32"}]
    kernels = []
    prev = 0
    for k in range(LAYERS * PER_LAYER):
        j = k % PER_LAYER
        tensors.append({"name": "w", "kind": "weight", "shape": [768], "dtype": "float32",
                        "bytes": 3072})
        tensors.append({"name": "add", "kind": "workspace", "shape": [1, 128, 768],
                        "dtype": "float32", "bytes": 393216, "offset": (k % 2) * 393216})
        name = OPS[j % len(OPS)] + ("_1" if j >= 10 else "")
        kernels.append({"name": "attention_probe" if k == PROBE else name,
                        "inputs": [prev, len(tensors) - 2], "outputs": [len(tensors) - 1]})
        prev = len(tensors) - 1
    tensors.append({"name": "y", "kind": "output", "shape": [1, 128, 768], "dtype": "float32"})
    kernels[-1]["outputs"] = [len(tensors) - 1]
    return {"version": 4, "kiln_version": "test", "prefix": "kiln_",
            "functions": {"main": {"kind": "graph", "params": [], "results": []}},
            "graphs": {"main": {"tensors": tensors, "kernels": kernels,
                                "workspace_bytes": 2 * 393216}}}


def test_unique_names() -> None:
    assert unique_names(["add", "relu", "add", "add#2", "add"]) == \
        ["add", "relu", "add#3", "add#2", "add#4"]
    names = unique_names(["add"] * 1000 + ["relu"] * 3)
    assert len(set(names)) == len(names) == 1003


def test_repeated_run() -> None:
    names = ["in", *(["mm", "add", "norm"] * 12), "out"]
    assert repeated_run(names) == Repeat(1, 3, 12)
    assert repeated_run(["a", "b", "c", "d"]) is None
    kernels = [k["name"] for k in synthetic_metadata()["graphs"]["main"]["kernels"]]
    run = repeated_run(kernels)
    # the probe breaks the run: the longest clean stretch of whole layers comes before it
    assert run is not None and run.period == PER_LAYER and run.count >= PROBE // PER_LAYER - 1


def png_pixels(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA non-interlaced PNG (what Chromium writes) as an array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + size
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    out = np.zeros((height, stride), np.uint8)
    prior = np.zeros(stride, np.int32)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], np.frombuffer(
            raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        if kind == 1:  # Sub: a running sum per channel
            row = np.cumsum(line.reshape(width, bpp), axis=0).reshape(-1) & 255
        elif kind == 2:  # Up
            row = (line + prior) & 255
        elif kind in (3, 4):  # Average, Paeth: each byte needs the one to its left
            row = line.copy()
            for x in range(stride):
                a = int(row[x - bpp]) if x >= bpp else 0
                b, c = int(prior[x]), int(prior[x - bpp]) if x >= bpp else 0
                if kind == 3:
                    row[x] = (row[x] + (a + b) // 2) & 255
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                    row[x] = (row[x] + pred) & 255
        else:
            row = line
        out[y] = row
        prior = row
    return out.reshape(height, width, bpp)


class Found(HTMLParser):
    """The search result's match count and the titles of the boxes marked found."""

    def __init__(self) -> None:
        super().__init__()
        self.matches: str | None = None
        self.titles: list[str] = []
        self.depth = 0  # > 0 inside a found box
        self.title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if a.get("id") == "search-result":
            self.matches = a.get("data-matches")
        if tag == "g" and "found" in a.get("class", "").split():
            self.depth = 1
        elif self.depth and tag == "title":
            self.title = True

    def handle_data(self, data: str) -> None:
        if self.title:
            self.titles.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.title = False
        elif tag == "g":
            self.depth = 0


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium (Debian package `chromium`, "
                    "installed by `make test`) is not on PATH")
def test_5000_kernel_report_in_chromium(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    metadata = synthetic_metadata()
    page = tmp_path / "big.html"
    html = render_report(metadata, "big.so")
    page.write_text(html, encoding="utf-8")
    # collapsed copies of the block: one box each, found by what they hold
    boxes = re.findall(r'<g class="node block" data-name="([^"]*)"><title>([^<]*)</title>', html)
    assert len(boxes) == PROBE // PER_LAYER - 1
    search, title = boxes[-1]
    assert "#4300 fused_matmul_packed_add" in search and "#4319 layer_norm_1" in search
    assert title.startswith(f"block {PROBE // PER_LAYER} of {PROBE // PER_LAYER}: "
                            "kernel calls #4300-#4319")
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--window-size=1280,900"]
    shot = tmp_path / "first.png"
    # Both at once (two cores); the screenshot at a quarter of the pixels keeps decoding quick.
    pictured = subprocess.Popen([*flags, f"--user-data-dir={tmp_path / 'a'}",
                                 "--force-device-scale-factor=0.25", f"--screenshot={shot}",
                                 page.as_uri()], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    dom = subprocess.run([*flags, f"--user-data-dir={tmp_path / 'b'}", "--dump-dom",
                          page.as_uri() + "?q=attention_probe"], capture_output=True,
                         text=True, timeout=180)
    _, err = pictured.communicate(timeout=180)
    assert pictured.returncode == 0 and dom.returncode == 0, err + dom.stderr.encode()

    found = Found()
    found.feed(dom.stdout)
    assert found.matches == "1", found.matches
    assert found.titles == [f"#{PROBE} attention_probe"]

    pixels = png_pixels(shot.read_bytes())[..., :3].astype(np.int32)
    inked = (pixels.min(axis=2) < 200)  # text, table rules, boxes, edges
    height = inked.shape[0]
    top, graph = inked[:height * 2 // 5], inked[height // 2:]
    # the summary (title, search, tables) fills the top; boxes and edges the graph below
    assert top.mean() > 0.01 and graph.mean() > 0.01, (top.mean(), graph.mean())
    assert inked.any(axis=1).mean() > 0.3  # content over the whole first screen


def test_profile_times_on_the_page(tmp_path: Path) -> None:
    """`kiln run --profile-json` then `kiln inspect --report --profile-json`: every kernel
    call's time (ms per call) on its box and in the table, the summary by op type timed."""
    done = run_kiln("compile", str(CNN), "-t", "llvm", "--profile", "-o", "cnn.so",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ran = run_kiln("run", "cnn.so", "--fill", "random", "--repeat", "3", "--profile-json",
                   "p.json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    made = run_kiln("inspect", "cnn.so", "--report", "r.html", "--profile-json", "p.json",
                    cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "kernel times of main" in made.stdout
    prof = json.loads((tmp_path / "p.json").read_text())
    html = (tmp_path / "r.html").read_text()
    for site in prof["sites"]:
        ms = f"{site['median_ns'] / 1e6:.4f}"  # the median per call
        assert re.search(rf"<td>{site['call']}</td><td>{re.escape(site['kernel'])}</td>"
                         rf".*?<td>{ms}</td></tr>", html), site
        assert re.search(rf"#{site['call']} {re.escape(site['kernel'])}</title>.*?{ms} ms",
                         html, re.S), site
    assert "<th>ms per call</th><th>share</th>" in html
    # a profile of another library is refused in one line
    (tmp_path / "other.json").write_text(json.dumps({**prof, "sites": prof["sites"][1:]}))
    line = one_line_error(run_kiln("inspect", "cnn.so", "--report", "r.html",
                                   "--profile-json", "other.json", cwd=tmp_path))
    assert "does not match this library's kernel calls" in line
