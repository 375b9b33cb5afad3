"""Attention by blocks of query rows (`block-attention`, kiln.kernels.gemm
.attention_blocks) against onnxruntime, on the host's llvm target and the c target
(which compiles the same kernel IR).

One model of two independent attentions whose scores exceed the L2 cache: the keys
transposed by the exporter (`transpose_b`) with a scale, 2 heads of 370 query rows
against 371 keys (a partial last block and a partial last key panel), 40-wide heads
and 24-wide values (a value panel wider than the values); and keys stored `[d, n]`
with the scores divided by 4 (a power of two: the kernel multiplies by 1/4) and a causal
mask (transformers' additive mask from `Range` and a comparison: the kernel's `causal`)
over the last 512 of 600 positions; the first adds a mask given as a graph input
(`[1, heads, 1, n]`, the kernel's `bias`) and zeroes NaN probabilities as torch's SDPA
export does (`zero_nan`), its first head masked whole with `-inf`, and its heads merged
after it (`Transpose` + `Reshape`, before an output projection: `merge_heads`). The same
on `host -precision=bf16` (bfloat16 products, float32 sums) within bfloat16's error.
Without a scale the pass applies too, and to scores within L2 (BERT-base's 12 x 128 x
128); a divisor other than a power of two, a decode step's one query row and small
scores keep the three kernels. Each causal mask form of kiln.transform.attention_masks
(torch's GPT-2 `Where` of a sliced lower-triangular buffer, masked_fill's `Where(Not(
Trilu(ones)), -inf, scores)`, the additive one) takes the kernel's `causal`; a mask
of another diagonal (whose first row is all masked) keeps the three kernels.
"""

from __future__ import annotations

import kernel_checks
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import TargetError
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.target import Target
from kiln.transform import get_pass
from support.graphs import GraphBuilder
from support.numerics import assert_close
from support.targets import native_target

pytest.importorskip("onnxruntime")

# (heads, query rows, keys, head width, value width, the keys transposed,
#  the scores' scale: (ONNX op, its constant) or None[, the mask's form: _mask])
Scale = tuple[str, float] | None
CASES = [(2, 370, 371, 40, 24, True, ("Mul", 0.125), "input"),
         (1, 512, 600, 16, 32, False, ("Div", 4.0), "add")]
LOWEST = float(np.finfo(np.float32).min)
#: The case whose output merges its heads (`Transpose` + `Reshape` to `[1, m, heads *
#: dv]`): the kernel stores them so (`merge_heads`).
MERGED = 0


def _mask(k: int, form: str, scores: str, m: int, n: int) -> tuple[list, list]:
    """The nodes and constants applying a mask of `form` to `scores` (`m` x `n`, the rows
    the last `m` positions), out as `z{k}`: the graph input `bias{k}` ("input") or a
    causal mask as an exporter writes it ("where", "fill", "add")."""
    z, node = f"z{k}", helper.make_node
    const = numpy_helper.from_array
    if form == "input":  # a mask from the graph's inputs: per head, over every row
        return [node("Add", [scores, f"bias{k}"], [z])], []
    if form == "where":  # torch's GPT-2: a [1, 1, P, P] buffer sliced to the sequence
        tril = np.tril(np.ones((n + 7, n + 7), bool))[None, None]
        return [node("Slice", [f"tril{k}", f"lo{k}", f"hi{k}", f"ax{k}"], [f"mask{k}"]),
                node("Where", [f"mask{k}", scores, f"low{k}"], [z])], [
            const(tril, f"tril{k}"), const(np.array([n - m, 0], np.int64), f"lo{k}"),
            const(np.array([n, n], np.int64), f"hi{k}"), const(np.array([2, 3], np.int64),
                                                                 f"ax{k}"),
            const(np.array(LOWEST, np.float32), f"low{k}")]
    if form == "fill":  # masked_fill(~tril(ones, n - m), -inf)
        return [node("ConstantOfShape", [f"shape{k}"], [f"ones{k}"],
                     value=const(np.array([1], np.int64))),
                node("Trilu", [f"ones{k}", f"diag{k}"], [f"tri{k}"], upper=0),
                node("Cast", [f"tri{k}"], [f"keep{k}"], to=TensorProto.BOOL),
                node("Not", [f"keep{k}"], [f"mask{k}"]),
                node("Where", [f"mask{k}", f"low{k}", scores], [z])], [
            const(np.array([m, n], np.int64), f"shape{k}"),
            const(np.array(n - m, np.int64), f"diag{k}"),
            const(np.array(-np.inf, np.float32), f"low{k}")]
    # transformers' 4-D mask: lowest where key > position, added to the scores
    return [node("Range", [f"zero{k}", f"n{k}", f"one{k}"], [f"keys{k}"]),
            node("Range", [f"start{k}", f"n{k}", f"one{k}"], [f"pos{k}"]),
            node("Unsqueeze", [f"pos{k}", f"last{k}"], [f"rows{k}"]),
            node("Greater", [f"keys{k}", f"rows{k}"], [f"after{k}"]),
            node("Where", [f"after{k}", f"low{k}", f"zf{k}"], [f"bias{k}"]),
            node("Add", [scores, f"bias{k}"], [z])], [
        const(np.array(0, np.int64), f"zero{k}"), const(np.array(n, np.int64), f"n{k}"),
        const(np.array(1, np.int64), f"one{k}"), const(np.array(n - m, np.int64), f"start{k}"),
        const(np.array([1], np.int64), f"last{k}"),
        const(np.array(LOWEST, np.float32), f"low{k}"), const(np.array(0, np.float32), f"zf{k}")]


def _branch(k: int, heads: int, m: int, n: int, d: int, dv: int, transposed: bool,
            scale: Scale, mask: str | None = None) -> tuple[list, list, list]:
    q, key, v, y = (f"{x}{k}" for x in ("q", "k", "v", "y"))
    key_shape = [1, heads, n, d] if transposed else [1, heads, d, n]
    nodes = [helper.make_node("Transpose", [key], [f"kt{k}"], perm=[0, 1, 3, 2])
             ] if transposed else []
    nodes.append(helper.make_node("MatMul", [q, f"kt{k}" if transposed else key], [f"s{k}"]))
    scores, inits = f"s{k}", []
    if scale is not None:
        inits.append(numpy_helper.from_array(np.array(scale[1], np.float32), f"c{k}"))
        nodes.append(helper.make_node(scale[0], [scores, f"c{k}"], [f"x{k}"]))
        scores = f"x{k}"
    if mask is not None:
        more, consts = _mask(k, mask, scores, m, n)
        nodes, inits, scores = [*nodes, *more], [*inits, *consts], f"z{k}"
    probs = f"p{k}"
    nodes.append(helper.make_node("Softmax", [scores], [probs], axis=-1))
    if mask == "input":  # torch's SDPA export: NaN probabilities (rows all -inf) as 0
        inits.append(numpy_helper.from_array(np.array(0, np.float32), f"zero{k}"))
        nodes += [helper.make_node("IsNaN", [probs], [f"nan{k}"]),
                  helper.make_node("Where", [f"nan{k}", f"zero{k}", probs], [f"pz{k}"])]
        probs = f"pz{k}"
    nodes.append(helper.make_node("MatMul", [probs, v], [y]))
    shapes = [(q, [1, heads, m, d]), (key, key_shape), (v, [1, heads, n, dv])]
    if mask == "input":
        shapes.append((f"bias{k}", [1, heads, 1, n]))
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
              for name, shape in shapes]
    return nodes, inputs, inits


def _model(keep: range = range(len(CASES))) -> onnx.ModelProto:
    nodes: list = []
    inputs: list = []
    inits: list = []
    outputs = []
    for k in keep:
        heads, m, n, d, dv, *rest = CASES[k]
        more, ins, consts = _branch(k, heads, m, n, d, dv, *rest)
        shape = [1, heads, m, dv]
        if k == MERGED:  # heads side by side in each row, as before an output projection
            shape = [1, m, heads * dv]
            inits.append(numpy_helper.from_array(np.array(shape, np.int64), f"rows{k}"))
            more = [*more, helper.make_node("Transpose", [f"y{k}"], [f"yt{k}"],
                                            perm=[0, 2, 1, 3]),
                    helper.make_node("Reshape", [f"yt{k}", f"rows{k}"], [f"ym{k}"])]
        nodes += more
        inputs += ins
        inits += consts
        outputs.append(helper.make_tensor_value_info(f"ym{k}" if k == MERGED else f"y{k}",
                                                     TensorProto.FLOAT, shape))
    return kernel_checks.branches_model("attention_blocks", nodes, inputs, outputs, inits)


MODEL = _model()
CHECK = kernel_checks.KernelCases(MODEL, CASES, 1e-5, np.random.default_rng(63))
CHECK.feeds["bias0"][0, 0] = -np.inf  # the first head's rows all masked: zeros out
reference = CHECK.reference_fixture()


#: The c target compiles the kernel IR the llvm target does: its check takes the causal
#: branch alone (the loops whose bounds are computed), which keeps the C compile short.
C_CASES = range(1, 2)


@pytest.fixture(scope="module", params=["llvm", "c"])
def native(request: pytest.FixtureRequest) -> tuple[kiln.driver.Executable, range]:
    keep = range(len(CASES)) if request.param == "llvm" else C_CASES
    return kiln.compile(from_onnx(_model(keep)), native_target(request.param)), keep


def test_blocked_attention_matches_onnxruntime(native: tuple[kiln.driver.Executable, range],
                                               reference: list[np.ndarray]) -> None:
    executable, keep = native
    names = {i.name for i in _model(keep).graph.input}
    got = executable(*(x for name, x in CHECK.feeds.items() if name in names))
    got = got if isinstance(got, (tuple, list)) else [got]
    assert_close([np.asarray(x) for x in got], [reference[k] for k in keep], CHECK.tol,
                 [CASES[k] for k in keep])


def _graph_calls(model: onnx.ModelProto, target: str) -> list[g.Call]:
    mod = from_onnx(model)
    with Target(target):
        for name in ("fold-constants", "merge-copies", "block-matmuls", "block-attention"):
            mod = get_pass(name)(mod)
    return [b.value for b in mod["main"].bindings if isinstance(b.value, g.Call)]


def _graph_ops(model: onnx.ModelProto, target: str) -> list[str]:
    return [c.op for c in _graph_calls(model, target)]


def test_bf16_blocked_attention_matches_onnxruntime(reference: list[np.ndarray]) -> None:
    try:
        target = Target("host -precision=bf16")
    except TargetError as err:
        pytest.skip(f"this host cannot run precision=bf16: {err}")
    got = kiln.compile(from_onnx(MODEL), target)(*CHECK.feeds.values())
    assert_close([np.asarray(x) for x in got], reference, 1e-2, CASES)


@pytest.mark.parametrize(("target", "op"), [("llvm -mcpu=znver4", "attention_tiled"), (
    "llvm -mcpu=znver4 -precision=bf16", "attention_tiled_bf16")])
def test_scores_past_the_l2_cache_take_the_blocked_kernel(target: str, op: str) -> None:
    calls = _graph_calls(MODEL, target)
    ops = [c.op for c in calls]
    assert ops.count(op) == len(CASES)
    assert "softmax" not in ops and not any(o.startswith("matmul_tiled") for o in ops)
    # the input mask is the kernel's bias, the additive one its causal; nothing is left
    assert [(bool(c.attrs.get("causal")), len(c.args), bool(c.attrs.get("zero_nan")),
             bool(c.attrs.get("merge_heads"))) for c in calls if c.op == op] == [
        (False, 4, True, True), (True, 3, False, False)]
    assert "where" not in ops and "add" not in ops and "isnan" not in ops
    assert "reshape_transpose" not in ops  # the merge of the heads is the kernel's store


def _one_attention(m: int, scale: Scale, heads: int = 8, n: int = 1500,
                   mask: str | None = None) -> onnx.ModelProto:
    nodes, inputs, inits = _branch(0, heads, m, n, 64, 64, True, scale, mask)
    b = GraphBuilder()
    b.add(*nodes)
    b.consts(inits)
    return b.model(inputs, [helper.make_tensor_value_info("y0", TensorProto.FLOAT,
                                                          [1, heads, m, 64])], name="attention")


def test_a_decode_step_keeps_the_three_kernels() -> None:
    ops = _graph_ops(_one_attention(1, ("Mul", 0.125)), "llvm -mcpu=znver4")
    assert "attention_tiled" not in ops and ops.count("matmul_tiled") == 2


@pytest.mark.parametrize(("heads", "seq", "blocked"), [(12, 128, True), (2, 64, False)])
def test_scores_within_l2_take_the_blocked_kernel_from_an_eighth(heads: int, seq: int,
                                                                  blocked: bool) -> None:
    # 786 KB of scores (BERT-base at sequence 128) against 1 MiB of L2; 32 KB stay unfused
    ops = _graph_ops(_one_attention(seq, ("Mul", 0.125), heads, seq), "llvm -mcpu=znver4")
    assert ("attention_tiled" in ops) == blocked


@pytest.mark.parametrize(("scale", "blocked"), [(None, True), (("Div", 8.0), True),
                                                (("Div", 6.0), False)])
def test_scales_the_kernel_takes(scale: Scale, blocked: bool) -> None:
    ops = _graph_ops(_one_attention(1500, scale), "llvm -mcpu=znver4")
    assert (ops == ["attention_tiled"]) == blocked


@pytest.mark.parametrize("form", ["where", "fill", "add"])
def test_causal_masks_take_the_causal_kernel(form: str) -> None:
    calls = _graph_calls(_one_attention(96, ("Div", 8.0), 4, 128, form), "llvm -mcpu=znver4")
    assert [(c.op, c.attrs.get("causal")) for c in calls] == [("attention_tiled", True)]


def test_a_padding_mask_over_gpt2s_causal_one_takes_both() -> None:
    # transformers' GPT-2 with an attention_mask input: Where(tril, x, lowest) + padding,
    # and torch's export casts the probabilities to float32, their own type
    model = _one_attention(96, ("Div", 8.0), 4, 128, "where")
    node = next(n for n in model.graph.node if n.op_type == "Where")
    node.output[0] = "w0"
    model.graph.node.insert(list(model.graph.node).index(node) + 1,
                            helper.make_node("Add", ["w0", "pad"], ["z0"]))
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    softmax.output[0] = "p0f"
    model.graph.node.insert(list(model.graph.node).index(softmax) + 1, helper.make_node(
        "Cast", ["p0f"], ["p0"], to=TensorProto.FLOAT))
    model.graph.input.append(helper.make_tensor_value_info("pad", TensorProto.FLOAT,
                                                           [1, 1, 1, 128]))
    calls = _graph_calls(model, "llvm -mcpu=znver4")
    assert [(c.op, c.attrs.get("causal"), len(c.args)) for c in calls] == [
        ("attention_tiled", True, 4)]


def test_a_mask_of_another_diagonal_keeps_the_three_kernels() -> None:
    # the rows see one key fewer than causal: the first row sees none
    model = _one_attention(128, None, 4, 128, "where")
    tril = next(t for t in model.graph.initializer if t.name == "tril0")
    tril.CopyFrom(numpy_helper.from_array(np.tril(np.ones((135, 135), bool), -1)[None, None],
                                          "tril0"))
    ops = _graph_ops(model, "llvm -mcpu=znver4")
    assert "attention_tiled" not in ops and "where" in ops
