"""`kiln inspect FILE --report page.html`: a self-contained HTML picture of a library.

From the library metadata alone (docs/abi.md; the "graphs" entry written by
kiln.codegen.graph_summary), and the kernel times of `kiln run --profile-json`
when given: for each lowered graph function a summary first (kernel calls,
bytes written, weights and time by op type), then the graph of its kernel calls
(one node per call with its output shapes and dtypes and its time, edges by
tensor, in layers from the inputs down; a run of repeated blocks, such as a
transformer's layers, collapsed to one node per block after the first) in a
viewport with fit, zoom, pan and search, and its memory plan (each workspace
tensor a bar at its byte offset, spanning the kernel calls from its first to
its last use). Tensor names are made unique (`add`, `add#2`, ...). Everything
is inline SVG, CSS and vanilla JS: the page needs no network. `?q=TEXT` in the
page's address runs a search on load. A library whose metadata has no "graphs"
(written before metadata version 2) gets a reduced page with the signatures
only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.cli.kernel_names import op_type
from kiln.cli.report_binding import Binding, concrete, representative
from kiln.cli.report_structure import Repeat, repeated_run, unique_names
from kiln.errors import UsageError
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
.viewport svg.graph { width: 100%; height: 70vh; margin: 0; cursor: grab; }
.hidden { display: none !important; }
.tools { margin: 4px 0; } .tools button { margin-right: 4px; }
#searchbar { position: sticky; top: 0; background: #fff; padding: 6px 0; z-index: 1; }
#search { width: 320px; }
.scroll { overflow-x: auto; }
.block rect { fill: #f7f0e1; stroke: #b07aa1; stroke-dasharray: 5 3; }
g.found rect { stroke: #d62728 !important; stroke-width: 5 !important; }
svg text { font: 11px monospace; fill: #222; }
.node rect { fill: #e8eef7; stroke: #4e79a7; }
.io rect { fill: #eef7e8; stroke: #59a14f; }
.edge { fill: none; stroke: #888; stroke-width: 1.4; }
.bar { stroke: #333; stroke-width: 0.5; opacity: 0.85; }
.hl { stroke: #d62728 !important; stroke-width: 3 !important; opacity: 1 !important; }
.note { color: #a33; }
"""

# Hovering anything tagged with a tensor highlights that tensor everywhere on the page;
# each graph's viewBox is its camera (fit, fit width, zoom on the wheel, pan by dragging);
# the search box (or ?q= in the address) marks the matching kernel boxes and shows the
# first one.
SCRIPT = """
document.querySelectorAll('[data-tensor]').forEach(function (el) {
  function mark(on) {
    document.querySelectorAll('[data-tensor="' + el.dataset.tensor + '"]').forEach(
      function (other) { other.classList.toggle('hl', on); });
  }
  el.addEventListener('mouseenter', function () { mark(true); });
  el.addEventListener('mouseleave', function () { mark(false); });
});
function view(svg, v) { svg.setAttribute('viewBox', v.map(function (x) {
  return x.toFixed(1); }).join(' ')); }
function box(svg) { return svg.getAttribute('viewBox').split(' ').map(Number); }
function ratio(svg) { return (svg.clientHeight || 600) / (svg.clientWidth || 1000); }
function fit(svg, whole) {
  var w = +svg.dataset.w, h = +svg.dataset.h, r = ratio(svg);
  if (whole) { var s = Math.max(w, h / r); view(svg, [(w - s) / 2, 0, s, s * r]); }
  else { var ww = Math.max(w, (svg.clientWidth || 1000) / 1.1);
         view(svg, [(w - ww) / 2, 0, ww, ww * r]); }
}
function zoom(svg, f, cx, cy) {
  var v = box(svg);
  if (cx === undefined) { cx = v[0] + v[2] / 2; cy = v[1] + v[3] / 2; }
  view(svg, [cx - (cx - v[0]) * f, cy - (cy - v[1]) * f, v[2] * f, v[3] * f]);
}
function visible(root) { return Array.prototype.filter.call(
  root.querySelectorAll('svg.graph'), function (s) { return !s.classList.contains('hidden'); }); }
document.querySelectorAll('.graphbox').forEach(function (gb) {
  gb.querySelectorAll('button[data-act]').forEach(function (b) {
    b.addEventListener('click', function () {
      visible(gb).forEach(function (svg) {
        var act = b.dataset.act;
        if (act === 'fit') fit(svg, true); else if (act === 'width') fit(svg, false);
        else zoom(svg, act === 'in' ? 0.7 : 1 / 0.7);
      });
    });
  });
  var expand = gb.querySelector('input.expand');
  if (expand) expand.addEventListener('change', function () {
    gb.querySelectorAll('svg.graph').forEach(function (svg) {
      svg.classList.toggle('hidden', svg.classList.contains('full') !== expand.checked); });
    visible(gb).forEach(function (svg) { fit(svg, false); });
  });
  gb.querySelectorAll('svg.graph').forEach(function (svg) {
    svg.addEventListener('wheel', function (e) {
      e.preventDefault();
      var v = box(svg), r = svg.getBoundingClientRect();
      zoom(svg, e.deltaY > 0 ? 1.15 : 1 / 1.15, v[0] + (e.clientX - r.left) / r.width * v[2],
           v[1] + (e.clientY - r.top) / r.height * v[3]);
    }, {passive: false});
    var drag = null;
    svg.addEventListener('mousedown', function (e) { drag = [e.clientX, e.clientY]; });
    window.addEventListener('mouseup', function () { drag = null; });
    window.addEventListener('mousemove', function (e) {
      if (!drag) return;
      var v = box(svg), k = v[2] / (svg.clientWidth || 1);
      view(svg, [v[0] - (e.clientX - drag[0]) * k, v[1] - (e.clientY - drag[1]) * k, v[2], v[3]]);
      drag = [e.clientX, e.clientY];
    });
  });
});
document.querySelectorAll('svg.graph').forEach(function (svg) {
  if (!svg.classList.contains('hidden')) fit(svg, false); });
function search(q) {
  q = q.trim().toLowerCase();
  var found = [];
  document.querySelectorAll('svg.graph g[data-name]').forEach(function (g) {
    var hit = q !== '' && g.dataset.name.indexOf(q) >= 0 &&
      !g.closest('svg').classList.contains('hidden');
    g.classList.toggle('found', hit);
    if (hit) found.push(g);
  });
  var out = document.getElementById('search-result');
  out.textContent = q === '' ? '' : found.length + ' match' + (found.length === 1 ? '' : 'es') +
    (found.length ? ': ' + found.slice(0, 3).map(function (g) {
      return g.querySelector('title').textContent; }).join(', ') : '');
  out.dataset.matches = found.length;
  if (found.length) {
    var svg = found[0].closest('svg'), rect = found[0].querySelector('rect'), v = box(svg);
    var x = +rect.getAttribute('x') + rect.getAttribute('width') / 2;
    var y = +rect.getAttribute('y') + rect.getAttribute('height') / 2;
    view(svg, [x - v[2] / 2, y - v[3] / 3, v[2], v[3]]);
  }
}
var input = document.getElementById('search');
if (input) {
  input.addEventListener('input', function () { search(input.value); });
  var q = new URLSearchParams(location.search).get('q');
  if (q) { input.value = q; search(q); }
}
"""


def _short(text: str, limit: int = MAX_LABEL) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _shape(t: dict[str, Any]) -> str:
    dims = "\u00d7".join(str(d) for d in t.get("shape", [])) or "scalar"
    return f"{dims} {t.get('dtype', '?')}"


def _workspace(g: dict[str, Any], binding: Binding) -> str:
    """A workspace's size: bytes; for a symbolic one its formula and its bytes at the
    report's binding (kiln.cli.report_binding)."""
    size, formula = g.get("workspace_bytes"), g.get("workspace_formula")
    if formula is None:
        return size if isinstance(size, str) else _bytes(size or 0)
    at = f" = {_bytes(size)} at {binding.text()}" if isinstance(size, int) else ""
    return f"{formula} bytes{at}"


def _sized(info: dict[str, Any]) -> str:
    """A tensor's bytes as the memory plan's tooltip says them, with the formula of a
    symbolic size."""
    size = _bytes(info["bytes"]) if isinstance(info.get("bytes"), int) else "?"
    return f"{info['formula']} = {size}" if "formula" in info else size


def _offset(info: dict[str, Any]) -> str:
    offset = info.get("offset", "")
    return f"{info['offset_formula']} = {offset}" if "offset_formula" in info else str(offset)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@dataclass
class _Node:
    """A box of the graph picture: a kernel call, a collapsed block of them, or an input
    or output tensor."""

    key: str
    title: str
    lines: list[str]
    tensor: int | None  # the tensor an input or output box stands for
    preds: list[tuple[str, int]] = field(default_factory=list)  # (node key, tensor)
    search: str = ""  # what the search box matches (lower case)
    ns: float | None = None  # time per call, when profiled
    block: bool = False
    layer: int = 0
    x: float = 0.0
    y: float = 0.0


@dataclass(frozen=True)
class _View:
    """What a function's pictures show besides its summary: unique tensor names, the
    time of each kernel call (ns per call of the function) and the whole call."""

    names: list[str]
    times: dict[int, float] = field(default_factory=dict)
    whole_ns: float = 0.0

    def time_line(self, ns: float | None) -> str:
        if ns is None:
            return ""
        return f"{ns / 1e6:.4f} ms {100 * ns / (self.whole_ns or 1):.1f}%"


def _graph_nodes(g: dict[str, Any], v: _View) -> dict[str, _Node]:
    tensors, nodes = g["tensors"], {}
    producer: dict[int, str] = {}
    for t, info in enumerate(tensors):
        if info["kind"] == "input":
            key = f"in{t}"
            nodes[key] = _Node(key, v.names[t], [_short(v.names[t]), _shape(info)], t,
                               search=v.names[t].lower())
            producer[t] = key
    for k, call in enumerate(g["kernels"]):
        key = f"k{k}"
        outs = [tensors[t] for t in call["outputs"]]
        weights = sum(1 for t in call["inputs"] if tensors[t]["kind"] == "weight")
        ns = v.times.get(k)
        third = " ".join(x for x in (f"{weights} weight{'s' if weights != 1 else ''}"
                                     if weights else "", v.time_line(ns)) if x)
        lines = [_short(f"#{k} {call['name']}"),
                 _short(" ".join(_shape(o) for o in outs) or "(no tensor output)"), third]
        words = [f"#{k}", call["name"], op_type(call["name"])]
        words += [v.names[t] for t in call["outputs"]]
        node = _Node(key, f"#{k} {call['name']}", lines, None, search=" ".join(words).lower(),
                     ns=ns)
        node.preds = [(producer[t], t) for t in call["inputs"] if t in producer]
        nodes[key] = node
        for t in call["outputs"]:
            producer[t] = key
    for t, info in enumerate(tensors):
        if info["kind"] == "output":
            key = f"out{t}"
            node = _Node(key, v.names[t], [_short(v.names[t]), _shape(info)], t,
                         search=v.names[t].lower())
            node.preds = [(producer[t], t)] if t in producer else []
            nodes[key] = node
    return nodes


def _collapsed(nodes: dict[str, _Node], repeat: Repeat, v: _View) -> dict[str, _Node]:
    """`nodes` with each copy of the repeated block after the first as one node."""
    owner = {f"k{k}": f"b{c}" for c in range(1, repeat.count) for k in repeat.calls(c)}
    out: dict[str, _Node] = {}
    for key, node in nodes.items():
        preds = [(owner.get(p, p), t) for p, t in node.preds]
        if key not in owner:
            node.preds = list(dict(reversed(preds)).items())[::-1]  # one edge per producer
            out[key] = node
            continue
        bkey = owner[key]
        if bkey not in out:
            c = int(bkey[1:])
            calls = repeat.calls(c)
            times = [v.times[k] for k in calls if k in v.times]
            ns = sum(times) if times else None
            title = (f"block {c + 1} of {repeat.count}: kernel calls #{calls[0]}-#{calls[-1]}"
                     f" (repeats #{repeat.calls(0)[0]}-#{repeat.calls(0)[-1]})")
            out[bkey] = _Node(bkey, title, [_short(f"block {c + 1}/{repeat.count}: "
                                                   f"#{calls[0]}-#{calls[-1]}"),
                                            f"{repeat.period} kernel calls", v.time_line(ns)],
                              None, ns=ns, block=True)
        block = out[bkey]
        block.search += " " + node.search
        block.preds += [(p, t) for p, t in preds
                        if p != bkey and p not in {q for q, _ in block.preds}]
    return out


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


def _heat(ns: float | None, whole: float) -> str:
    """A box's fill by its share of the call: white to orange."""
    if ns is None or not whole:
        return ""
    share = min(1.0, ns / whole * 5)  # 20% of the call or more is the full colour
    return f' style="fill: hsl(30, 90%, {97 - 35 * share:.0f}%)"'


def graph_svg(fname: str, g: dict[str, Any], v: _View | None = None,
              repeat: Repeat | None = None, full: bool = False) -> str:
    """The graph picture of one function's summary (`repeat` collapsed unless `full`)."""
    v = v or _View(unique_names([t["name"] for t in g["tensors"]]))
    nodes = _graph_nodes(g, v)
    if repeat is not None and not full:
        nodes = _collapsed(nodes, repeat, v)
    width, height = _layout(nodes)
    tensors = g["tensors"]
    ident = f"graph-{fname}-full" if full else f"graph-{fname}"
    cls = "graph full hidden" if full else "graph"
    parts = [f'<svg id="{h(ident)}" class="{cls}" xmlns="http://www.w3.org/2000/svg" '
             f'data-w="{width}" data-h="{height}" preserveAspectRatio="xMidYMin meet" '
             f'viewBox="0 0 {width} {height}">',
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
                f'{x2:.1f} {y2:.1f}"><title>{h(v.names[t])}: '
                f'{h(_shape(tensors[t]))}</title></path>')
    for node in nodes.values():
        io = node.tensor is not None
        tag = f' data-tensor="{h(fname)}:{node.tensor}"' if io else ""
        kind = "io" if io else "node block" if node.block else "node"
        parts.append(f'<g class="{kind}"{tag} data-name="{h(node.search)}">'
                     f"<title>{h(node.title)}</title>"
                     f'<rect x="{node.x:.1f}" y="{node.y:.1f}" width="{NODE_W}" '
                     f'height="{NODE_H}" rx="{12 if io else 4}"'
                     f"{_heat(node.ns, v.whole_ns)}/>")
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


def memory_svg(fname: str, g: dict[str, Any], names: Sequence[str] | None = None) -> str:
    """The memory plan: workspace offset (down) against kernel call index (across)."""
    names = names or [t["name"] for t in g["tensors"]]
    tensors, calls = g["tensors"], len(g["kernels"])
    span = lifetimes(g)
    # drawn: workspace tensors of static size and place (symbolic ones are in the table)
    planned = [(t, info) for t, info in enumerate(tensors)
               if info["kind"] == "workspace" and t in span and info.get("bytes")
               and isinstance(info.get("offset"), int)]
    static_total = g.get("workspace_bytes")
    total = max([static_total if isinstance(static_total, int) else 0]
                + [info["offset"] + info["bytes"] for _, info in planned] + [1])
    col = max(4.0, min(60.0, 900.0 / max(calls, 1)))  # thousands of calls: it scrolls
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
            f'<title>{h(names[t])}: {h(_shape(info))}, {h(_sized(info))} at '
            f'offset {h(_offset(info))}, calls {first}-{last}</title></rect>')
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


def _nbytes(info: dict[str, Any]) -> int:
    size = info.get("bytes")
    return size if isinstance(size, int) else 0


def summary_rows(g: dict[str, Any], v: _View) -> list[list[object]]:
    """By op type: kernel calls, bytes their outputs write, weight bytes they read and,
    when profiled, time per call and share; longest (else most called) first."""
    tensors = g["tensors"]
    ops: dict[str, list[Any]] = {}
    for k, call in enumerate(g["kernels"]):
        acc = ops.setdefault(op_type(call["name"]), [0, 0, set(), 0.0])
        acc[0] += 1
        acc[1] += sum(_nbytes(tensors[t]) for t in call["outputs"])
        acc[2].update(t for t in call["inputs"] if tensors[t]["kind"] == "weight")
        acc[3] += v.times.get(k, 0.0)
    order = sorted(ops.items(), key=lambda kv: (-kv[1][3], -kv[1][0], kv[0]))
    rows: list[list[object]] = []
    for op, (calls, written, weights, ns) in order:
        row: list[object] = [op, calls, _bytes(written),
                             _bytes(sum(_nbytes(tensors[t]) for t in weights))]
        if v.times:
            row += [f"{ns / 1e6:.4f}", f"{100 * ns / (v.whole_ns or 1):.1f}%"]
        rows.append(row)
    return rows


def _function_section(fname: str, g: dict[str, Any], v: _View,
                      binding: Binding | None = None) -> str:
    tensors = g["tensors"]
    span = lifetimes(g)
    repeat = repeated_run([c["name"] for c in g["kernels"]])
    kernels = [[k, c["name"], op_type(c["name"]), ", ".join(v.names[t] for t in c["inputs"]),
                ", ".join(v.names[t] for t in c["outputs"]),
                f"{v.times[k] / 1e6:.4f}" if k in v.times else ""]
               for k, c in enumerate(g["kernels"])]
    binding = binding or Binding()
    rows = [[t, v.names[t], info["kind"], _shape(info),
             _sized(info) if "formula" in info else info.get("bytes") or "?",
             _offset(info), "{}-{}".format(*span[t]) if t in span else ""]
            for t, info in enumerate(tensors)]
    weights = sum(_nbytes(t) for t in tensors if t["kind"] == "weight")
    timed = (f", {v.whole_ns / 1e6:.4f} ms per call (kiln run --profile-json)"
             if v.times else "")
    at = f" at {binding.text()}" if binding.values else ""
    head = ["op type", "kernel calls", f"bytes written{at}", "weights"]
    head += ["ms per call", "share"] if v.times else []
    tools = ('<div class="tools"><button data-act="fit">fit to screen</button>'
             '<button data-act="width">fit width</button><button data-act="in">zoom in'
             '</button><button data-act="out">zoom out</button> (wheel zooms, drag pans)')
    if repeat is not None:
        first = repeat.calls(0)
        tools += (f' <label><input type="checkbox" class="expand"> expand the repeated '
                  f"blocks</label> ({repeat.count} blocks of {repeat.period} kernel calls "
                  f"from #{first[0]}: block 1 drawn, the rest one box each)")
    tools += "</div>"
    graphs = graph_svg(fname, g, v, repeat)
    if repeat is not None:
        graphs += "\n" + graph_svg(fname, g, v, repeat, full=True)
    return "\n".join([
        f"<h2>{h(fname)}: {len(g['kernels'])} kernel calls, workspace "
        f"{h(_workspace(g, binding))}, weights {h(_bytes(weights))}"
        f"{h(timed)}</h2>",
        _binding_note(binding),
        "<h3>Summary by op type</h3>", _table(head, summary_rows(g, v)),
        "<h3>Graph</h3>",
        f'<div class="graphbox">{tools}<div class="viewport">{graphs}</div></div>',
        "<h3>Memory plan</h3>",
        "<p>Each bar is a tensor of the workspace arena: down, its byte offset and size; "
        f"across, the kernel calls from its first to its last use{h(at)}.</p>",
        f'<div class="scroll">{memory_svg(fname, g, v.names)}</div>',
        f"<details><summary>Kernel calls ({len(kernels)})</summary>",
        _table(["#", "kernel", "op type", "inputs", "outputs", "ms per call"], kernels),
        "</details>",
        f"<details><summary>Tensors ({len(rows)})</summary>",
        _table(["id", "name", "kind", "shape", "bytes", "offset", "calls"], rows),
        "</details>",
    ])


def _binding_note(binding: Binding) -> str:
    """The paragraph saying at which sizes a function of symbolic shape is drawn."""
    if not binding.values:
        return ""
    return (f'<p class="binding">Symbolic sizes are drawn at {h(binding.text())}: each '
            "dimension variable at the size kiln's pin hints suggest (1 for a batch, 128 "
            "for any other size; kiln.ir.pin_hint), within its bounds. The bytes and "
            "offsets of the tables and the memory plan's tooltips give the formula and "
            "its value there.</p>")


def profile_views(metadata: dict[str, Any], profile: dict[str, Any] | None) -> dict[str, _View]:
    """Each graph function's view: unique tensor names, and the kernel times of
    `profile` (a `kiln run --profile-json` file) for the function it profiled."""
    graphs = metadata.get("graphs") or {}
    views = {f: _View(unique_names([t["name"] for t in g["tensors"]]))
             for f, g in graphs.items()}
    if profile is None:
        return views
    try:
        fname = profile["function"]
        sites = profile["sites"]
        calls = int(profile["calls"]) or 1
        # the median per call (robust to a descheduled call); a file from before
        # medians were written has the totals
        whole = float(profile["whole_call"].get("median_ns",
                                                profile["whole_call"]["total_ns"] / calls))
        kernels = [str(s["kernel"]) for s in sites]
        times = {int(s["call"]): float(s.get("median_ns", s["total_ns"] / calls))
                 for s in sites}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"--profile-json: not a profile written by kiln run --profile-json "
                         f"({type(exc).__name__}: {exc})") from None
    graph = graphs.get(fname)
    if graph is None or [c["name"] for c in graph["kernels"]] != kernels:
        raise UsageError(f"--profile-json: the profile of {fname!r} does not match this "
                         "library's kernel calls (profile the same library)")
    views[fname] = _View(views[fname].names, times, whole)
    return views


def render_report(metadata: dict[str, Any], source: str,
                  profile: dict[str, Any] | None = None) -> str:
    """The HTML page for a library's metadata; `source` names the file in the title;
    `profile` (a `kiln run --profile-json` file) adds the kernel times."""
    graphs = metadata.get("graphs") or {}
    views = profile_views(metadata, profile)
    body = [f"<h1>kiln report: {h(source)}</h1>",
            f"<p>library metadata version {h(metadata.get('version', '?'))}, built by kiln "
            f"{h(metadata.get('kiln_version', '?'))}, symbol prefix "
            f"{h(metadata.get('prefix', '?'))}"
            f"{', with profiling timers' if metadata.get('profile') else ''}"
            f"{', kernel times from a profile' if profile is not None else ''}</p>"]
    if graphs:
        body.append('<div id="searchbar"><input id="search" type="search" placeholder='
                    '"search kernels by name, op type or tensor"> <span id="search-result">'
                    "</span></div>")
    else:
        body.append('<p class="note">This file\'s metadata holds no graph summary (a '
                    "library written before library metadata version 2, a Model Library "
                    "Format archive, or no lowered graph function): a .so, .tar or .a built "
                    "by this kiln has the graph and memory plan pictures.</p>")
    for fname, g in graphs.items():
        dims = ((metadata.get("functions") or {}).get(fname) or {}).get("dims")
        binding = representative(g, dims if isinstance(dims, list) else None)
        body.append(_function_section(fname, concrete(g, binding) if binding.values else g,
                                      views[fname], binding))
    body += ["<h2>Functions</h2>",
             _table(["function", "kind", "parameters", "results"], _signature_rows(metadata))]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>kiln report: {h(source)}</title>", f"<style>{STYLE}</style></head><body>",
        *body, f"<script>{SCRIPT}</script>", "</body></html>", ""])


def write_report(metadata: dict[str, Any], source: str, out: str,
                 profile: dict[str, Any] | None = None) -> str:
    """Write the page to `out`; a one-line summary of what it holds."""
    page = render_report(metadata, source, profile)
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    graphs = metadata.get("graphs") or {}
    if not graphs:
        return (f"wrote {out} (signatures only: the metadata of {source} holds no graph "
                "summary; a .so, .tar or .a built by this kiln has one)")
    timed = f", kernel times of {profile['function']}" if profile is not None else ""
    return f"wrote {out}: graph and memory plan of {', '.join(graphs)}{timed}"


def read_profile(path: str) -> dict[str, Any]:
    """The JSON that `kiln run --profile-json` wrote; UsageError naming `path` otherwise."""

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise UsageError(f"--profile-json {path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--profile-json {path}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--profile-json {path}: not a profile written by kiln run "
                         "--profile-json (not a JSON object)")
    return data
