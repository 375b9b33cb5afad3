"""`kiln inspect --report`: a self-contained HTML page that headless Chromium renders."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from kiln_cli import ROOT, run_kiln

from kiln.cli.inspect import load_any
from kiln.cli.report import render_report

CNN = ROOT / "models" / "tiny_cnn.onnx"
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("report")
    done = run_kiln("compile", str(CNN), "-t", "llvm", "-o", "cnn.so", cwd=where)
    assert done.returncode == 0, done.stderr
    made = run_kiln("inspect", "cnn.so", "--report", "report.html", cwd=where)
    assert made.returncode == 0, made.stderr
    assert "graph and memory plan of main" in made.stdout
    return where / "report.html"


# Appended to a copy of the page: Chromium writes each SVG element's rendered box into
# the DOM, so --dump-dom shows what was laid out, not just what the file says.
MEASURE = """<script>
document.querySelectorAll('svg, svg rect, svg g').forEach(function (e) {
  var b = e.getBoundingClientRect();
  e.setAttribute('data-box', Math.round(b.width) + 'x' + Math.round(b.height));
});
</script>"""


class SvgShapes(HTMLParser):
    """Per <svg id=...>: its rendered box, and its <rect>s and <g>s rendered non-empty."""

    def __init__(self) -> None:
        super().__init__()
        self.svg: str | None = None
        self.boxes: dict[str, tuple[int, int]] = {}
        self.rects: dict[str, list[dict[str, str]]] = {}
        self.groups: dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        w, _, h = a.get("data-box", "0x0").partition("x")
        rendered = int(w) > 0 and int(h) > 0
        if tag == "svg":
            self.svg = a.get("id", "")
            self.boxes[self.svg] = (int(w), int(h))
            self.rects.setdefault(self.svg, [])
            self.groups.setdefault(self.svg, 0)
        elif self.svg is not None and tag == "rect" and rendered:
            self.rects[self.svg].append(a)
        elif self.svg is not None and tag == "g" and rendered:
            self.groups[self.svg] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.svg = None


def test_page_needs_no_network(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"\b(src|href)\s*=", text)
    assert "<link" not in text and "@import" not in text
    # The only URL is SVG's namespace name, which is never fetched.
    assert set(re.findall(r"https?://[^\s\"'<>]+", text)) == {"http://www.w3.org/2000/svg"}


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium (Debian package `chromium`, "
                    "installed by `make test`) is not on PATH")
def test_chromium_renders_the_graph_and_the_memory_plan(page: Path, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
             "--window-size=1200,1800"]
    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom = subprocess.run([*flags, "--dump-dom", measured.as_uri()], capture_output=True,
                         text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    shot = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True,
                   timeout=120, check=True)
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000

    shapes = SvgShapes()
    shapes.feed(dom.stdout)
    _, metadata, _ = load_any(str(page.parent / "cnn.so"))
    graph = metadata["graphs"]["main"]
    kernels = len(graph["kernels"])
    io = sum(1 for t in graph["tensors"] if t["kind"] in ("input", "output"))
    assert min(shapes.boxes["graph-main"]) > 100 and min(shapes.boxes["memory-main"]) > 100
    # One box per kernel call and per input/output tensor.
    assert shapes.groups["graph-main"] == kernels + io
    assert len(shapes.rects["graph-main"]) == kernels + io
    used = {t for call in graph["kernels"] for t in (*call["inputs"], *call["outputs"])}
    planned = [t for t, info in enumerate(graph["tensors"])
               if info["kind"] == "workspace" and t in used]
    bars = [r for r in shapes.rects["memory-main"] if r.get("class") == "bar"]
    assert len(bars) == len(planned) > 0
    assert {b["data-tensor"] for b in bars} == {f"main:{t}" for t in planned}


def test_library_without_a_graph_summary_gets_the_signatures_only(page: Path) -> None:
    _, metadata, _ = load_any(str(page.parent / "cnn.so"))
    reduced = {k: v for k, v in metadata.items() if k != "graphs"}
    html = render_report(reduced, "old.so")
    assert "holds no graph summary" in html and "<svg" not in html
    assert "image: 1\u00d73\u00d716\u00d716 float32" in html


def test_names_are_escaped(page: Path) -> None:
    _, metadata, _ = load_any(str(page.parent / "cnn.so"))
    metadata["graphs"]["main"]["tensors"][0]["name"] = "<script>alert(1)</script>"
    html = render_report(metadata, "a&b.so")
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)" in html
    assert "a&amp;b.so" in html
