"""`kiln inspect FILE --report page.html`: a self-contained HTML picture of a library.

From the library metadata alone (docs/abi.md; the "graphs" entry written by
kiln.codegen.graph_summary): for each lowered graph function, the graph of its
kernel calls (one node per call with its output shapes and dtypes, edges by
tensor, in layers from the inputs down) and its memory plan (each workspace
tensor a bar at its byte offset, spanning the kernel calls from its first to
its last use). Everything is inline SVG, CSS and a few lines of JS (hovering a
tensor highlights it in both pictures): the page needs no network. A library
whose metadata has no "graphs" (written before metadata version 2) gets a
reduced page with the signatures only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.escape import html_text as h

NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 230, 58, 28, 54, 16
SKIP_BOW = 56  # how far an edge that skips layers bows out to the right
MEMORY_H, MEMORY_LEFT, MEMORY_TOP = 360, 84, 14
# Bar colours of the memory plan, cycled.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
MAX_LABEL = 30

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 32px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
svg { border: 1px solid #ddd; background: #fcfcfc; display: block; margin: 8px 0; }
svg text { font: 11px monospace; fill: #222; }
.node rect { fill: #e8eef7; stroke: #4e79a7; }
.io rect { fill: #eef7e8; stroke: #59a14f; }
.edge { fill: none; stroke: #888; stroke-width: 1.4; }
.bar { stroke: #333; stroke-width: 0.5; opacity: 0.85; }
.hl { stroke: #d62728 !important; stroke-width: 3 !important; opacity: 1 !important; }
.note { color: #a33; }
"""

# Hovering anything tagged with a tensor highlights that tensor everywhere on the page.
SCRIPT = """
document.querySelectorAll('[data-tensor]').forEach(function (el) {
  function mark(on) {
    document.querySelectorAll('[data-tensor="' + el.dataset.tensor + '"]').forEach(
      function (other) { other.classList.toggle('hl', on); });
  }
  el.addEventListener('mouseenter', function () { mark(true); });
  el.addEventListener('mouseleave', function () { mark(false); });
});
"""


def _short(text: str, limit: int = MAX_LABEL) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _shape(t: dict[str, Any]) -> str:
    dims = "\u00d7".join(str(d) for d in t.get("shape", [])) or "scalar"
    return f"{dims} {t.get('dtype', '?')}"


def _workspace(size: Any) -> str:
    """A workspace's size: bytes, or the expression of a symbolic one (its text)."""
    return size if isinstance(size, str) else _bytes(size or 0)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@dataclass
class _Node:
    """A box of the graph picture: a kernel call, or an input or output tensor."""

    key: str
    title: str
    lines: list[str]
    tensor: int | None  # the tensor an input or output box stands for
    preds: list[tuple[str, int]] = field(default_factory=list)  # (node key, tensor)
    layer: int = 0
    x: float = 0.0
    y: float = 0.0


def _graph_nodes(g: dict[str, Any]) -> dict[str, _Node]:
    tensors, nodes = g["tensors"], {}
    producer: dict[int, str] = {}
    for t, info in enumerate(tensors):
        if info["kind"] == "input":
            key = f"in{t}"
            nodes[key] = _Node(key, info["name"], [_short(info["name"]), _shape(info)], t)
            producer[t] = key
    for k, call in enumerate(g["kernels"]):
        key = f"k{k}"
        outs = [tensors[t] for t in call["outputs"]]
        weights = sum(1 for t in call["inputs"] if tensors[t]["kind"] == "weight")
        lines = [_short(f"#{k} {call['name']}"),
                 _short(" ".join(_shape(o) for o in outs) or "(no tensor output)"),
                 f"{weights} weight{'s' if weights != 1 else ''}" if weights else ""]
        node = _Node(key, call["name"], lines, None)
        node.preds = [(producer[t], t) for t in call["inputs"] if t in producer]
        nodes[key] = node
        for t in call["outputs"]:
            producer[t] = key
    for t, info in enumerate(tensors):
        if info["kind"] == "output":
            key = f"out{t}"
            node = _Node(key, info["name"], [_short(info["name"]), _shape(info)], t)
            node.preds = [(producer[t], t)] if t in producer else []
            nodes[key] = node
    return nodes


def _layout(nodes: dict[str, _Node]) -> tuple[int, int]:
    """Layers by longest path from the inputs; in each layer, order by the mean column of
    the predecessors (fewer crossings). Returns the picture's (width, height)."""
    layers: list[list[_Node]] = []
    for node in nodes.values():  # insertion order is a topological order
        node.layer = 1 + max((nodes[p].layer for p, _ in node.preds), default=-1)
        while len(layers) <= node.layer:
            layers.append([])
        layers[node.layer].append(node)
    column: dict[str, float] = {}
    for row in layers:
        row.sort(key=lambda n: sum(column[p] for p, _ in n.preds) / len(n.preds)
                 if n.preds else -1.0)
        for c, node in enumerate(row):
            column[node.key] = c
    widest = max((len(row) for row in layers), default=1)
    width = MARGIN * 2 + widest * NODE_W + (widest - 1) * GAP_X + SKIP_BOW
    for row in layers:
        used = len(row) * NODE_W + (len(row) - 1) * GAP_X
        left = (width - SKIP_BOW - used) / 2
        for c, node in enumerate(row):
            node.x = left + c * (NODE_W + GAP_X)
            node.y = MARGIN + node.layer * (NODE_H + GAP_Y)
    height = MARGIN * 2 + len(layers) * NODE_H + max(len(layers) - 1, 0) * GAP_Y
    return int(width), int(height)


def graph_svg(fname: str, g: dict[str, Any]) -> str:
    """The graph picture of one function's summary."""
    nodes = _graph_nodes(g)
    width, height = _layout(nodes)
    tensors = g["tensors"]
    parts = [f'<svg id="graph-{h(fname)}" class="graph" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" '
             'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
             '<path d="M 0 0 L 10 5 L 0 10 z" fill="#888"/></marker></defs>']
    for node in nodes.values():
        for pred, t in node.preds:
            src = nodes[pred]
            if node.layer - src.layer > 1:  # skips layers: bow out right of the boxes
                x1, y1 = src.x + NODE_W, src.y + NODE_H / 2
                x2, y2 = node.x + NODE_W, node.y + NODE_H / 2
                c1, c2 = (x1 + SKIP_BOW, y1), (x2 + SKIP_BOW, y2)
            else:
                x1, y1 = src.x + NODE_W / 2, src.y + NODE_H
                x2, y2 = node.x + NODE_W / 2, node.y
                c1, c2 = (x1, y1 + GAP_Y / 2), (x2, y2 - GAP_Y / 2)
            parts.append(
                f'<path class="edge" data-tensor="{h(fname)}:{t}" marker-end="url(#arrow)" '
                f'd="M {x1:.1f} {y1:.1f} C {c1[0]:.1f} {c1[1]:.1f} {c2[0]:.1f} {c2[1]:.1f} '
                f'{x2:.1f} {y2:.1f}"><title>{h(tensors[t]["name"])}: '
                f'{h(_shape(tensors[t]))}</title></path>')
    for node in nodes.values():
        io = node.tensor is not None
        tag = f' data-tensor="{h(fname)}:{node.tensor}"' if io else ""
        parts.append(f'<g class="{"io" if io else "node"}"{tag}>'
                     f"<title>{h(node.title)}</title>"
                     f'<rect x="{node.x:.1f}" y="{node.y:.1f}" width="{NODE_W}" '
                     f'height="{NODE_H}" rx="{12 if io else 4}"/>')
        for i, line in enumerate(x for x in node.lines if x):
            parts.append(f'<text x="{node.x + 8:.1f}" y="{node.y + 17 + i * 15:.1f}">'
                         f"{h(line)}</text>")
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


def lifetimes(g: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """(first, last) kernel call using each tensor that some call uses."""
    span: dict[int, tuple[int, int]] = {}
    for k, call in enumerate(g["kernels"]):
        for t in (*call["inputs"], *call["outputs"]):
            first, _ = span.get(t, (k, k))
            span[t] = (first, k)
    return span


def memory_svg(fname: str, g: dict[str, Any]) -> str:
    """The memory plan: workspace offset (down) against kernel call index (across)."""
    tensors, calls = g["tensors"], len(g["kernels"])
    span = lifetimes(g)
    # drawn: workspace tensors of static size and place (symbolic ones are in the table)
    planned = [(t, info) for t, info in enumerate(tensors)
               if info["kind"] == "workspace" and t in span and info.get("bytes")
               and isinstance(info.get("offset"), int)]
    static_total = g.get("workspace_bytes")
    total = max([static_total if isinstance(static_total, int) else 0]
                + [info["offset"] + info["bytes"] for _, info in planned] + [1])
    col = max(14.0, min(60.0, 900.0 / max(calls, 1)))
    width = int(MEMORY_LEFT + calls * col + MARGIN)
    height = MEMORY_TOP + MEMORY_H + 40
    scale = MEMORY_H / total
    parts = [f'<svg id="memory-{h(fname)}" class="memory" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             f'<rect x="{MEMORY_LEFT}" y="{MEMORY_TOP}" width="{calls * col:.1f}" '
             f'height="{MEMORY_H}" fill="none" stroke="#999"/>']
    for q in range(5):
        y = MEMORY_TOP + MEMORY_H * q / 4
        parts.append(f'<text x="{MEMORY_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f"{h(_bytes(total * q / 4))}</text>")
    step = max(1, calls // 30)
    for k in range(0, calls, step):
        parts.append(f'<text x="{MEMORY_LEFT + (k + 0.5) * col:.1f}" '
                     f'y="{MEMORY_TOP + MEMORY_H + 16}" text-anchor="middle">{k}</text>')
    parts.append(f'<text x="{MEMORY_LEFT + calls * col / 2:.1f}" y="{height - 6}" '
                 'text-anchor="middle">kernel call</text>')
    for i, (t, info) in enumerate(planned):
        first, last = span[t]
        parts.append(
            f'<rect class="bar" data-tensor="{h(fname)}:{t}" fill="{PALETTE[i % len(PALETTE)]}" '
            f'x="{MEMORY_LEFT + first * col + 1:.1f}" '
            f'y="{MEMORY_TOP + info["offset"] * scale:.1f}" '
            f'width="{(last - first + 1) * col - 2:.1f}" '
            f'height="{max(info["bytes"] * scale, 2.0):.1f}">'
            f'<title>{h(info["name"])}: {h(_shape(info))}, {h(_bytes(info["bytes"]))} at '
            f'offset {info["offset"]}, calls {first}-{last}</title></rect>')
    if not planned:
        parts.append(f'<text x="{MEMORY_LEFT + 8}" y="{MEMORY_TOP + 20}">'
                     "no planned workspace</text>")
    parts.append("</svg>")
    return "\n".join(parts)


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{h(x)}</th>" for x in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{h(x)}</td>" for x in row) + "</tr>" for row in rows]
    return "\n".join(out) + "</table>"


def _signature_rows(metadata: dict[str, Any]) -> list[list[object]]:
    rows: list[list[object]] = []
    for name, fn in metadata.get("functions", {}).items():
        params = ", ".join(f"{p.get('name')}: {_shape(p)}" for p in fn.get("params", []))
        results = ", ".join(f"{p.get('name')}: {_shape(p)}" for p in fn.get("results", []))
        rows.append([name, fn.get("kind", ""), params, results or "-"])
    return rows


def _function_section(fname: str, g: dict[str, Any]) -> str:
    tensors = g["tensors"]
    span = lifetimes(g)
    kernels = [[k, c["name"], ", ".join(tensors[t]["name"] for t in c["inputs"]),
                ", ".join(tensors[t]["name"] for t in c["outputs"])]
               for k, c in enumerate(g["kernels"])]
    rows = [[t, info["name"], info["kind"], _shape(info), info.get("bytes") or "?",
             info.get("offset", ""), "{}-{}".format(*span[t]) if t in span else ""]
            for t, info in enumerate(tensors)]
    return "\n".join([
        f"<h2>{h(fname)}: {len(g['kernels'])} kernel calls, workspace "
        f"{h(_workspace(g.get('workspace_bytes')))}</h2>",
        "<h3>Graph</h3>", graph_svg(fname, g),
        "<h3>Memory plan</h3>",
        "<p>Each bar is a tensor of the workspace arena: down, its byte offset and size; "
        "across, the kernel calls from its first to its last use.</p>",
        memory_svg(fname, g),
        "<h3>Kernel calls</h3>", _table(["#", "kernel", "inputs", "outputs"], kernels),
        "<h3>Tensors</h3>",
        _table(["id", "name", "kind", "shape", "bytes", "offset", "calls"], rows),
    ])


def render_report(metadata: dict[str, Any], source: str) -> str:
    """The HTML page for a library's metadata; `source` names the file in the title."""
    graphs = metadata.get("graphs") or {}
    body = [f"<h1>kiln report: {h(source)}</h1>",
            f"<p>library metadata version {h(metadata.get('version', '?'))}, built by kiln "
            f"{h(metadata.get('kiln_version', '?'))}, symbol prefix "
            f"{h(metadata.get('prefix', '?'))}"
            f"{', with profiling timers' if metadata.get('profile') else ''}</p>"]
    if not graphs:
        body.append('<p class="note">This file\'s metadata holds no graph summary (a '
                    "library written before library metadata version 2, a Model Library "
                    "Format archive, or no lowered graph function): a .so, .tar or .a built "
                    "by this kiln has the graph and memory plan pictures.</p>")
    for fname, g in graphs.items():
        body.append(_function_section(fname, g))
    body += ["<h2>Functions</h2>",
             _table(["function", "kind", "parameters", "results"], _signature_rows(metadata))]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>kiln report: {h(source)}</title>", f"<style>{STYLE}</style></head><body>",
        *body, f"<script>{SCRIPT}</script>", "</body></html>", ""])


def write_report(metadata: dict[str, Any], source: str, out: str) -> str:
    """Write the page to `out`; a one-line summary of what it holds."""
    with open(out, "w", encoding="utf-8") as f:
        f.write(render_report(metadata, source))
    graphs = metadata.get("graphs") or {}
    if not graphs:
        return (f"wrote {out} (signatures only: the metadata of {source} holds no graph "
                "summary; a .so, .tar or .a built by this kiln has one)")
    return f"wrote {out}: graph and memory plan of {', '.join(graphs)}"
