"""The contrib ops decoder-LLM exporters write (kiln/frontend/onnx/converters/contrib_llm.py)
against onnxruntime, on llvm and c, with a symbolic batch and sequence: the RMSNorm family
and SkipLayerNormalization (every output), and MatMulNBits with weights packed by
onnxruntime's own MatMulNBitsQuantizer (4 and 8 bits, symmetric and not, blocks of 32
and 128, K not a multiple of the block) or by hand (g_idx, float zero points, 2 bits),
RotaryEmbedding, GroupQueryAttention (prompt, decode on a growing cache and on a shared
buffer, a later prompt chunk; GQA ratios 4 and 1, RoPE on and off, softcap, a local
window, packed QKV, lengths from an attention mask) and GatherBlockQuantized.
One model per group, compiled once per target."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.errors import CallError, FrontendError, PerformanceWarning
from kiln.frontend import from_onnx
from support.graphs import GraphBuilder
from support.nbits import hand_packed, pack_codes
from support.reference import onnxruntime_outputs

MS = "com.microsoft"
HIDDEN = 64
SHAPES = ((2, 5), (1, 1), (3, 17))  # (batch, seq) the libraries run at
TARGETS = ["llvm", "c"]


def _model(b: GraphBuilder) -> onnx.ModelProto:
    return b.model(opset={"": 17, MS: 1}, check=False)


def norms_model() -> onnx.ModelProto:
    """SimplifiedLayerNormalization (with inv_std_var; on float16), SkipSimplifiedLayerNormalization
    (bias, a (seq, hidden) skip, all four outputs) and SkipLayerNormalization (beta,
    bias, all four outputs), as onnxruntime-genai's builder chains them."""
    b = GraphBuilder(seed=3)
    x = b.input("x", ["batch", "seq", HIDDEN])
    skip = b.input("skip", ["seq", HIDDEN])
    gamma = b.const(b.rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32), "gamma")
    bias = b.const(b.rng.normal(0, 0.1, HIDDEN).astype(np.float32), "bias")
    beta = b.const(b.rng.normal(0, 0.1, HIDDEN).astype(np.float32), "beta")
    b.node("SimplifiedLayerNormalization", [x, gamma], ["rms", "rms_inv"], epsilon=1e-6)
    b.node("SkipSimplifiedLayerNormalization", ["rms", skip, gamma, bias],
           ["srms", "srms_mean", "srms_inv", "srms_sum"], domain=MS, epsilon=1e-6)
    b.node("SkipLayerNormalization", ["srms_sum", x, gamma, beta, bias],
           ["sln", "sln_mean", "sln_inv", "sln_sum"], domain=MS, epsilon=1e-5)
    # the residual stream as the builder writes it: output 0 and output 3 only
    b.node("SkipSimplifiedLayerNormalization", ["sln", "sln_sum", gamma],
           ["last", "", "", "last_sum"], domain=MS)
    # float16 computed in the float32 stash type, rounded once (as onnxruntime does)
    x16 = b.input("x16", ["batch", "seq", HIDDEN], TensorProto.FLOAT16)
    b.node("SimplifiedLayerNormalization",
           [x16, b.const(b.rng.uniform(0.5, 1.5, HIDDEN).astype(np.float16), "g16")],
           ["rms16"])
    for name in ("rms16", "rms", "rms_inv", "srms", "srms_mean", "srms_inv", "srms_sum", "sln",
                 "sln_mean", "sln_inv", "sln_sum", "last", "last_sum"):
        b.output(name, typed=False)
    return _model(b)


@pytest.fixture(scope="module", params=TARGETS)
def norms(request: pytest.FixtureRequest) -> tuple[onnx.ModelProto, kiln.Executable]:
    model = norms_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)  # GenericKernelWarning included
        exe = kiln.compile(from_onnx(model), request.param)
    return model, exe


def test_rms_norms_and_skip_layer_norm_match_onnxruntime(norms) -> None:  # type: ignore[no-untyped-def]
    model, exe = norms
    assert "generic_kernels" not in exe.metadata
    rng = np.random.default_rng(5)
    for batch, seq in SHAPES:
        feeds = {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32) * 3,
                 "skip": rng.standard_normal((seq, HIDDEN)).astype(np.float32),
                 "x16": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float16)}
        want = onnxruntime_outputs(model, feeds)
        got = exe["main"](*feeds.values())
        for name, g, w in zip([o.name for o in model.graph.output], got, want):
            g = np.asarray(g)
            assert g.shape == w.shape, name
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=f"{name} {seq}")


# ------------------------------------------------------------------------- MatMulNBits

#: name -> (bits, block_size, symmetric, K, N): what MatMulNBitsQuantizer writes. One
#: K = 144 (4.5 blocks of 32, 1.125 of 128: the last block padded) and N = 16 throughout,
#: so that the products share their kernels and the test stays fast.
K, N = 144, 16
QUANTIZED = {
    "s4b32": (4, 32, True, K, N),
    "a4b32": (4, 32, False, K, N),
    "s4b128": (4, 128, True, K, N),
    "a4b128": (4, 128, False, K, N),
    "a8b32": (8, 32, False, K, N),
}


def _quantized_node(name: str, bits: int, block: int, symmetric: bool, k: int,
                    n: int) -> onnx.ModelProto:
    """A MatMul by a random [K, N] weight (+ an Add of a bias the quantizer leaves apart),
    quantized by onnxruntime's MatMulNBitsQuantizer."""
    quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    b = GraphBuilder(seed=len(name) + k)
    b.input(f"a_{name}", ["batch", "seq", k])
    w = b.const(b.rng.normal(0, 1, (k, n)).astype(np.float32), name=f"w_{name}")
    b.node("MatMul", [f"a_{name}", w], [f"y_{name}"], name=f"mm_{name}")
    b.output(f"y_{name}", ["batch", "seq", n])
    q = quantizer.MatMulNBitsQuantizer(_model(b), bits=bits, block_size=block,
                                       is_symmetric=symmetric)
    q.process()
    model = q.model.model
    assert [node.op_type for node in model.graph.node] == ["MatMulNBits"], name
    return model


def _merged(models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """One model holding every node, initializer, input and output of `models`."""
    b = GraphBuilder()
    for m in models:
        b.add(*m.graph.node)
        b.consts(list(m.graph.initializer))
        b.inputs.extend(m.graph.input)
        b.outputs.extend(m.graph.output)
    return _model(b)


def hand_packed_model() -> onnx.ModelProto:
    b = GraphBuilder(seed=13)
    hand_packed(b, "h8_bias", 8, K, N, 16, bias=True)  # K a multiple of the block
    hand_packed(b, "h4_float_zp", 4, K, N, 32, zp="float")
    hand_packed(b, "h4_default_zp", 4, K, N, 64, zp="none", bias=True)
    hand_packed(b, "h4_gidx", 4, K, N, 16, zp="float", g_idx=True)
    hand_packed(b, "h4_gidx_default_zp", 4, K, N, 32, zp="none", g_idx=True)
    hand_packed(b, "h2", 2, K, N, 16)
    return _model(b)


@pytest.fixture(scope="module")
def nbits_model() -> onnx.ModelProto:
    """Every quantized and hand-packed node in one model: one compile a target."""
    return _merged([_quantized_node(name, *cfg) for name, cfg in QUANTIZED.items()]
                   + [hand_packed_model()])


@pytest.mark.parametrize("target", TARGETS)
def test_matmul_nbits_matches_onnxruntime(nbits_model: onnx.ModelProto, target: str) -> None:
    """accuracy_level unset: onnxruntime dequantizes B and multiplies in float32, as kiln
    does, so only the order of the sums differs (rtol 1e-4 over K = 144 products)."""
    model = nbits_model
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        exe = kiln.compile(from_onnx(model), target)
    rng = np.random.default_rng(17)
    for batch, seq in SHAPES[:2]:
        feeds = {i.name: rng.standard_normal(
            (batch, seq, i.type.tensor_type.shape.dim[2].dim_value)).astype(np.float32)
            for i in model.graph.input}
        want = onnxruntime_outputs(model, feeds)
        got = exe["main"](*feeds.values())
        for out, g, w in zip(model.graph.output, got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{out.name} {batch}x{seq}")


@pytest.mark.parametrize(("attrs", "why"), [
    ({"bits": 3}, "bits 3"),
    ({"block_size": 24}, "power of two"),
    ({"K": 40}, r"B of type uint8 and shape \[8, 2, 8\]: expected uint8 \[8, 3, 8\]"),
    ({"g_idx": np.arange(32, dtype=np.int32) % 2, "zp": True}, "packed uint8 zero_points"),
    ({"g_idx": np.arange(32, dtype=np.int32) % 3}, r"32 block indices in \[0, 2\)"),
])
def test_malformed_matmul_nbits_is_refused(attrs: dict, why: str) -> None:
    b = GraphBuilder(seed=2)
    b.input("a", ["seq", 32])
    g_idx = attrs.pop("g_idx", None)
    zp = b.const(np.zeros((8, 1), np.uint8)) if attrs.pop("zp", False) else ""
    node_attrs = {"K": 32, "N": 8, "bits": 4, "block_size": 16, **attrs}
    b.node("MatMulNBits", ["a", b.const(np.zeros((8, 2, 8), np.uint8)),
                           b.const(np.ones((8, 2), np.float32)), zp]
           + ([] if g_idx is None else [b.const(g_idx)]), ["y"], domain=MS, **node_attrs)
    b.output("y", ["seq", 8])
    with pytest.raises(FrontendError, match=why):
        from_onnx(_model(b))


def test_matmul_nbits_of_another_k_than_a_is_refused() -> None:
    b = GraphBuilder(seed=2)
    b.input("a", ["seq", 48], TensorProto.FLOAT)
    b.node("MatMulNBits", ["a", b.const(np.zeros((8, 2, 8), np.uint8)),
                           b.const(np.ones((8, 2), np.float32))], ["y"], domain=MS,
           K=32, N=8, bits=4, block_size=16)
    b.output("y", ["seq", 8])
    with pytest.raises(FrontendError, match="last dimension K = 32"):
        from_onnx(_model(b))


# --------------------------------------------------------------------- RotaryEmbedding

MAX_POS = 64


def _caches(b: GraphBuilder, half: int) -> tuple[str, str]:
    """cos/sin caches (MAX_POS, half) of RoPE's angles (base 10000), as the builder bakes."""
    inv = 1.0 / 10000 ** (np.arange(half) / half)
    angles = np.outer(np.arange(MAX_POS), inv)
    return (b.const(np.cos(angles).astype(np.float32), "cos"),
            b.const(np.sin(angles).astype(np.float32), "sin"))


#: name -> (input shape, attributes, position ids "2d" (batch, seq) or "start" (1,))
ROTARIES = {
    "half_3d": (["batch", "seq", 32], {"num_heads": 2}, "2d"),
    "interleaved_partial_3d": (["batch", "seq", 32],
                               {"num_heads": 2, "interleaved": 1, "rotary_embedding_dim": 8},
                               "2d"),
    "half_4d_start": (["batch", 2, "seq", 16], {}, "start"),
    "interleaved_4d": (["batch", 3, "seq", 16], {"interleaved": 1}, "2d"),
}


def rotary_model() -> onnx.ModelProto:
    b = GraphBuilder(seed=21)
    b.input("pos", ["batch", "seq"], TensorProto.INT64)
    b.input("start", [1], TensorProto.INT64)
    for name, (shape, attrs, ids) in ROTARIES.items():
        half = attrs.get("rotary_embedding_dim", 16) // 2
        cos, sin = _caches(b, half)
        b.input(name, shape)
        b.node("RotaryEmbedding", [name, "pos" if ids == "2d" else "start", cos, sin],
               [f"y_{name}"], domain=MS, **attrs)
        b.output(f"y_{name}", shape)
    return _model(b)


@pytest.mark.parametrize("target", TARGETS)
def test_rotary_embedding_matches_onnxruntime(target: str) -> None:
    model = rotary_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        exe = kiln.compile(from_onnx(model), target)
    rng = np.random.default_rng(23)
    for batch, seq in SHAPES:
        feeds: dict[str, np.ndarray] = {
            "pos": rng.integers(0, MAX_POS, (batch, seq)).astype(np.int64),
            "start": np.array([MAX_POS - seq - 1], np.int64)}
        for name, (shape, _, _) in ROTARIES.items():
            dims = [batch if d == "batch" else seq if d == "seq" else d for d in shape]
            feeds[name] = rng.standard_normal(dims).astype(np.float32)
        want = onnxruntime_outputs(model, feeds)
        got = exe["main"](*feeds.values())
        for out, g, w in zip(model.graph.output, got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{out.name} {batch}x{seq}")


def test_unsupported_llm_op_forms_are_refused() -> None:
    """A float16 MatMulNBits, a RotaryEmbedding whose caches disagree with its rotary
    dimension: clear errors naming the node, not a wrong answer."""
    b = GraphBuilder(seed=2)
    b.input("a", ["seq", 32], TensorProto.FLOAT16)
    b.node("MatMulNBits", ["a", b.const(np.zeros((8, 2, 8), np.uint8)),
                           b.const(np.ones((8, 2), np.float16))], ["y"], domain=MS,
           K=32, N=8, bits=4, block_size=16, name="mm16")
    b.output("y", ["seq", 8], TensorProto.FLOAT16)
    with pytest.raises(FrontendError, match=r"mm16.*float16 and bfloat16 ones are not"):
        from_onnx(_model(b))
    b = GraphBuilder(seed=2)
    b.input("x", ["batch", "seq", 32])
    b.input("pos", ["batch", "seq"], TensorProto.INT64)
    cos, sin = _caches(b, 4)
    b.node("RotaryEmbedding", ["x", "pos", cos, sin], ["y"], domain=MS, num_heads=2,
           name="rope")
    b.output("y", ["batch", "seq", 32])
    with pytest.raises(FrontendError, match=r"rope.*rotary dimension 16 and caches of 4"):
        from_onnx(_model(b))


# ------------------------------------------------------------------ GroupQueryAttention

#: name -> (num_heads, kv_num_heads, head_size, attributes, packed QKV, rotary columns):
#: GQA ratio 4 from a packed QKV with a local window and no rotary; ratio 1 with softcap,
#: a scale and RoPE over part of a head (half-split: the interleaved lanes are
#: RotaryEmbedding's, tested above). Two nodes: each costs some 40 kernels to compile.
GQA_NODES = {
    "g4": (8, 2, 16, {"local_window_size": 2}, True, 0),
    "mk": (2, 2, 32, {"softcap": 2.0, "scale": 0.3}, False, 8),
}
#: (batch, seq, past, seqlens_k, total_sequence_length): a padded prompt from an empty
#: past, a decode step on a growing cache, a later prompt chunk after a past. A step on a
#: shared buffer (past = the buffer's length, seqlens_k below it) is
#: test_group_query_attention_writes_a_shared_buffer_in_place's.
GQA_STEPS = ((2, 5, 0, [4, 2], 5), (2, 1, 5, [5, 3], 6), (1, 3, 4, [6], 7))


def _gqa_node(b: GraphBuilder, name: str, heads: int, kv: int, head: int, attrs: dict,
              packed: bool, half: int, lengths: tuple[str, str]) -> None:
    if packed:
        qkv = [b.input(f"q_{name}", ["batch", "seq", (heads + 2 * kv) * head]), "", ""]
    else:
        qkv = [b.input(f"q_{name}", ["batch", "seq", heads * head]),
               b.input(f"k_{name}", ["batch", "seq", kv * head]),
               b.input(f"v_{name}", ["batch", "seq", kv * head])]
    # "mk" names its head size as onnxruntime-genai's builder does (a free dimension,
    # pinned by the op's contract at import)
    size: int | str = "kv_cache_dim" if name == "mk" else head
    past = [b.input(f"{p}_{name}", ["batch", kv, "past", size]) for p in ("pk", "pv")]
    caches = list(_caches(b, half)) if half else []
    b.node("GroupQueryAttention", [*qkv, *past, *lengths, *caches],
           [f"y_{name}", f"present_k_{name}", f"present_v_{name}"], domain=MS,
           num_heads=heads, kv_num_heads=kv, do_rotary=int(bool(half)), **attrs)
    for out in ("y", "present_k", "present_v"):
        b.output(f"{out}_{name}", typed=False)


def gqa_model() -> onnx.ModelProto:
    """Every GQA_NODES node in one model; "mk" reads seqlens_k and total_sequence_length
    from an attention mask as onnxruntime-genai's builder writes them (ReduceSum - 1, and
    the mask's length through Shape), the others from the inputs."""
    b = GraphBuilder(seed=29)
    given = (b.input("seqlens_k", ["batch"], TensorProto.INT32),
             b.input("total_sequence_length", [], TensorProto.INT32))
    mask = b.input("attention_mask", ["batch", "total"], TensorProto.INT64)
    seqlens = b.op("Cast", b.op("Sub", b.op("ReduceSum", mask, b.const(np.array([1])),
                                            keepdims=0), b.const(np.array(1))),
                   to=TensorProto.INT32)
    total = b.op("Cast", b.op("Gather", b.op("Shape", mask), b.const(np.array(1))),
                 to=TensorProto.INT32)
    for name, (heads, kv, head, attrs, packed, half) in GQA_NODES.items():
        _gqa_node(b, name, heads, kv, head, attrs, packed, half,
                  (seqlens, total) if name == "mk" else given)
    return _model(b)


@pytest.fixture(scope="module", params=TARGETS)
def gqa(request: pytest.FixtureRequest) -> tuple[onnx.ModelProto, kiln.Executable]:
    model = gqa_model()
    return model, kiln.compile(from_onnx(model), request.param)


def _gqa_feeds(model: onnx.ModelProto, rng: np.random.Generator, batch: int, seq: int,
               past: int, seqlens: list[int], total: int) -> dict[str, np.ndarray]:
    sizes = {"batch": batch, "seq": seq, "past": past, "kv_cache_dim": GQA_NODES["mk"][2]}
    feeds: dict[str, np.ndarray] = {}
    for i in model.graph.input:
        dims = [d.dim_value or sizes.get(d.dim_param, 0) for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
    feeds["seqlens_k"] = np.array(seqlens, np.int32)
    feeds["total_sequence_length"] = np.array(total, np.int32)
    feeds["attention_mask"] = (np.arange(total) <= np.array(seqlens)[:, None]).astype(np.int64)
    return feeds


def test_group_query_attention_matches_onnxruntime(gqa) -> None:  # type: ignore[no-untyped-def]
    """Output rows of a padded prompt's padding (row s >= seqlens_k + 1) are unspecified
    (the contrib op's spec), so only the others are compared; every present row is."""
    model, exe = gqa
    rng = np.random.default_rng(31)
    for batch, seq, past, seqlens, total in GQA_STEPS:
        feeds = _gqa_feeds(model, rng, batch, seq, past, seqlens, total)
        want = onnxruntime_outputs(model, feeds)
        got = exe["main"](*feeds.values())
        valid = np.arange(seq) < np.minimum(seq, np.array(seqlens) + 1)[:, None]
        for out, g, w in zip(model.graph.output, got, want):
            g = np.asarray(g)
            assert g.shape == w.shape, (out.name, seq, past)
            if out.name.startswith("y_"):
                g, w = g[valid], w[valid]
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{out.name} {batch}x{seq} past {past}")


def test_group_query_attention_writes_a_shared_buffer_in_place(gqa) -> None:  # type: ignore[no-untyped-def]
    """Each present is marked in place of its past (docs/abi.md): given the past's own
    array as `out=` at the past's length (onnxruntime's shared buffer), the call writes
    only the new rows there, the rest of the buffer as it was, and computes onnxruntime's
    output, reading no row past each batch row's keys (the rows there hold NaN: the
    attention's key loops end at seqlens_k + 1, the softcap form's ("mk") too). Any
    other overlap is refused, and so is
    a call whose present comes back at another length than its past (a growing cache) in
    the past's buffer."""
    model, exe = gqa
    fn = exe["main"]
    params = [p["name"] for p in fn.params]
    marks = {r["name"]: r.get("in_place_of") for r in fn.results}
    assert {name: params[marks[f"present_{k}_{name}"]] for name in GQA_NODES for k in "kv"} \
        == {name: f"p{k}_{name}" for name in GQA_NODES for k in "kv"}
    feeds = _gqa_feeds(model, np.random.default_rng(7), 2, 1, 8, [3, 6], 7)
    want = dict(zip([o.name for o in model.graph.output], onnxruntime_outputs(model, feeds)))
    before = {k: v.copy() for k, v in feeds.items()}
    rows = np.arange(8) <= np.array([3, 6])[:, None]  # each row's cache after the step
    for name in GQA_NODES:
        for k in "kv":
            before[f"p{k}_{name}"].transpose(0, 2, 1, 3)[~rows] = np.nan
    out = []  # each present's out= (its bound, past + seq) starts with its past
    for r, shape in zip(fn.results, fn.output_shapes(**feeds)):
        out.append(np.zeros(shape, np.float32))
        if r["name"].startswith("present"):
            past = f"p{r['name'][8]}_{r['name'][10:]}"
            feeds[past] = out[-1].reshape(-1)[:feeds[past].size].reshape(feeds[past].shape)
            feeds[past][...] = before[past]
    got = dict(zip([r["name"] for r in fn.results], fn(**feeds, out=out)))
    for name in GQA_NODES:
        np.testing.assert_allclose(got[f"y_{name}"], want[f"y_{name}"], rtol=1e-4, atol=1e-5)
        for k in "kv":
            present, past = got[f"present_{k}_{name}"], feeds[f"p{k}_{name}"]
            assert np.shares_memory(present, past) and present.shape == past.shape
            np.testing.assert_allclose(present.transpose(0, 2, 1, 3)[rows],
                                       want[f"present_{k}_{name}"].transpose(0, 2, 1, 3)[rows],
                                       rtol=1e-6)
            np.testing.assert_array_equal(past.transpose(0, 2, 1, 3)[~rows],
                                          before[f"p{k}_{name}"].transpose(0, 2, 1, 3)[~rows])
    room = np.zeros(out[1].size + 64, np.float32)  # the present a row further on
    feeds["pk_g4"] = room[:feeds["pk_g4"].size].reshape(feeds["pk_g4"].shape)
    out[1] = room[64:].reshape(out[1].shape)
    with pytest.raises(CallError, match="argument 4's own buffer only: the same first byte"):
        fn(**feeds, out=out)
    grow = _gqa_feeds(model, np.random.default_rng(8), 2, 1, 5, [5, 3], 6)
    out = [np.empty(shape, np.float32) for shape in fn.output_shapes(**grow)]
    grow["pk_g4"] = out[1].reshape(-1)[:grow["pk_g4"].size].reshape(grow["pk_g4"].shape)
    with pytest.raises(CallError, match=r"at shape .* not the argument's .*contents are lost"):
        fn(**grow, out=out)


def test_group_query_attention_pins_a_free_head_size(gqa) -> None:  # type: ignore[no-untyped-def]
    """The builder's `kv_cache_dim` (the past's head size) is the node's head size:
    imported with no pins, it is pinned (a call with another size is refused, as
    onnxruntime refuses it)."""
    model, exe = gqa
    shapes = {p["name"]: p["shape"] for p in exe["main"].signature["params"]}
    assert shapes["pk_mk"] == shapes["pv_mk"] == ["batch", 2, "past", 32]
    feeds = _gqa_feeds(model, np.random.default_rng(2), 2, 1, 4, [2, 2], 5)
    feeds["pk_mk"] = feeds["pv_mk"] = np.zeros((2, 2, 4, 16), np.float32)
    with pytest.raises(CallError):
        exe["main"](*feeds.values())


def test_group_query_attention_refuses_seqlens_past_the_present(gqa) -> None:  # type: ignore[no-untyped-def]
    """seqlens_k + 1 above the present's length, or below 1: onnxruntime refuses the call,
    and so does kiln (a clear error, not rows read from elsewhere)."""
    model, exe = gqa
    rng = np.random.default_rng(3)
    for seqlens in ([6, 2], [-1, 2]):
        feeds = _gqa_feeds(model, rng, 2, 1, 4, [2, 2], 5)
        feeds["seqlens_k"] = np.array(seqlens, np.int32)
        with pytest.raises(CallError, match="out of range"):
            exe["main"](*feeds.values())


def test_group_query_attention_refuses_a_total_past_the_cache(gqa) -> None:  # type: ignore[no-untyped-def]
    """A total_sequence_length above past + seq (here 6 for 4 + 1): onnxruntime refuses
    the call; kiln's error names the input rather than the size it computes from it."""
    model, exe = gqa
    feeds = _gqa_feeds(model, np.random.default_rng(5), 2, 1, 4, [2, 2], 6)
    with pytest.raises(Exception, match="total_sequence_length"):  # onnxruntime's own class
        onnxruntime_outputs(model, feeds)
    with pytest.raises(CallError, match="GroupQueryAttention: total_sequence_length is above"):
        exe["main"](*feeds.values())


@pytest.mark.parametrize(("change", "why"), [
    ({"inputs": {10: "bias"}}, "input attention_bias is not supported"),
    ({"attrs": {"smooth_softmax": 1}}, "smooth_softmax=1 is not supported"),
    ({"attrs": {"num_heads": 3}}, "num_heads 3 must be a positive multiple of kv_num_heads 2"),
    ({"attrs": {"do_rotary": 1}}, "do_rotary needs cos_cache and sin_cache"),
    ({"inputs": {4: ""}}, "past_key and past_value are both given or both absent"),
])
def test_unsupported_group_query_attention_is_refused(change: dict, why: str) -> None:
    b = GraphBuilder(seed=2)
    inputs = [b.input("q", ["batch", "seq", 64]), b.input("k", ["batch", "seq", 32]),
              b.input("v", ["batch", "seq", 32]), b.input("pk", ["batch", 2, "past", 16]),
              b.input("pv", ["batch", 2, "past", 16]),
              b.input("seqlens", ["batch"], TensorProto.INT32),
              b.input("total", [], TensorProto.INT32), "", "", "", ""]
    b.input("bias", ["batch", 4, "seq", "total"])
    for k, name in change.get("inputs", {}).items():
        inputs[k] = name
    attrs = {"num_heads": 4, "kv_num_heads": 2, **change.get("attrs", {})}
    b.node("GroupQueryAttention", inputs, ["y"], domain=MS, name="gqa", **attrs)
    b.output("y", ["batch", "seq", 64])
    with pytest.raises(FrontendError, match=f"gqa.*{why}"):
        from_onnx(_model(b))


# ---------------------------------------------------------------- GatherBlockQuantized

VOCAB, WIDTH = 10, 64


def _gbq_model() -> onnx.ModelProto:
    """Embedding tables as onnxruntime-genai's builder writes tied int4 embeddings (uint8
    data packing 4 bits, packed uint8 zero points) and the other forms: 8 and 2 bits,
    default zero points, and int4/uint4 tensors gathered along axis 1, quantized along 0."""
    b = GraphBuilder(seed=37)
    rng = b.rng
    b.input("ids", ["batch", "seq"], TensorProto.INT64)
    for bits, block, zp in ((4, 32, True), (8, 16, False), (2, 32, True), (4, 64, False)):
        blocks = WIDTH // block
        inputs = [b.const(pack_codes(rng.integers(0, 1 << bits, (VOCAB, WIDTH)), bits)), "ids",
                  b.const(rng.uniform(0.01, 0.1, (VOCAB, blocks)).astype(np.float32))]
        if zp:
            width = -(-blocks // (8 // bits)) * (8 // bits)
            inputs.append(b.const(pack_codes(rng.integers(0, 1 << bits, (VOCAB, width)), bits)))
        b.node("GatherBlockQuantized", inputs, [f"u{bits}_{block}"], domain=MS, bits=bits,
               block_size=block)
        b.output(f"u{bits}_{block}", typed=False)
    for elem, low in ((TensorProto.INT4, -8), (TensorProto.UINT4, 0)):
        data, zps = rng.integers(low, low + 16, (WIDTH, VOCAB)), rng.integers(low, low + 16,
                                                                            (2, VOCAB))
        names = [b.name("data"), b.name("zp")]
        b.consts([onnx.helper.make_tensor(n, elem, v.shape, v.reshape(-1).tolist())
                  for n, v in zip(names, (data, zps))])
        b.node("GatherBlockQuantized",
               [names[0], "ids", b.const(rng.uniform(0.01, 0.1, (2, VOCAB)).astype(np.float32)),
                names[1]], [f"i{elem}"], domain=MS, block_size=32, gather_axis=1,
               quantize_axis=0)
        b.output(f"i{elem}", typed=False)
    return _model(b)


def test_gather_block_quantized_matches_onnxruntime() -> None:
    """Dequantized at import, so exact; out-of-range ids give zeros as onnxruntime's
    kernel does. One target: the gather is kiln's own, tested on both elsewhere."""
    model = _gbq_model()
    exe = kiln.compile(from_onnx(model), "llvm")
    for ids in (np.array([[0, 3, 9, -1], [11, -10, 2, -11]]), np.array([[5]])):
        want = onnxruntime_outputs(model, {"ids": ids})
        got = exe["main"](ids)
        for out, g, w in zip(model.graph.output, got, want):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=out.name)


@pytest.mark.parametrize(("attrs", "why"), [
    ({"bits": 3}, "bits 3: uint8 data packs 2, 4 or 8"),
    ({"block_size": 24}, "power of two"),
    ({"gather_axis": 1}, "uint8 data gathers along axis 0"),
    ({"quantize_axis": 0}, "uint8 data quantizes along the last axis"),
    ({"block_size": 16}, r"scales of shape \[10, 2\]: expected \[10, 4\]"),
])
def test_malformed_gather_block_quantized_is_refused(attrs: dict, why: str) -> None:
    b = GraphBuilder(seed=2)
    b.input("ids", ["seq"], TensorProto.INT64)
    b.node("GatherBlockQuantized", [b.const(np.zeros((VOCAB, 32), np.uint8)), "ids",
                                    b.const(np.ones((VOCAB, 2), np.float32))], ["y"],
           domain=MS, name="gbq", **{"bits": 4, "block_size": 32, **attrs})
    b.output("y", ["seq", WIDTH])
    with pytest.raises(FrontendError, match=f"gbq.*{why}"):
        from_onnx(_model(b))


# ------------------------------------------------------------------- MultiHeadAttention

MHA_HEADS, MHA_HEAD = 2, 16


def mha_model() -> onnx.ModelProto:
    """Self-attention with the projection's bias, a 0/1 key_padding_mask over past +
    seq, a past and unidirectional; cross-attention over another length with keys and
    values given per head (BNSH, as a decoder's cross-attention cache is), per-row key
    lengths, an attention_bias and a scale. Two nodes: the compile is the test's cost."""
    b = GraphBuilder(seed=41)
    width = MHA_HEADS * MHA_HEAD
    b.node("MultiHeadAttention",
           [b.input("q1", ["batch", "seq", width]), b.input("k1", ["batch", "seq", width]),
            b.input("v1", ["batch", "seq", width]),
            b.const(b.rng.normal(0, 1, 3 * width).astype(np.float32)),
            b.input("mask1", ["batch", "total"], TensorProto.INT32), "",
            b.input("pk1", ["batch", MHA_HEADS, "past", MHA_HEAD]),
            b.input("pv1", ["batch", MHA_HEADS, "past", MHA_HEAD])],
           ["y1", "present_k1", "present_v1"], domain=MS, num_heads=MHA_HEADS,
           unidirectional=1)
    b.node("MultiHeadAttention",
           [b.input("q2", ["batch", "seq", width]),
            b.input("k2", ["batch", MHA_HEADS, "kv", MHA_HEAD]),
            b.input("v2", ["batch", MHA_HEADS, "kv", MHA_HEAD]), "",
            b.input("lengths2", ["batch"], TensorProto.INT32),
            b.input("bias2", [1, MHA_HEADS, "seq", "kv"])], ["y2"], domain=MS,
           num_heads=MHA_HEADS, scale=0.2)
    for out in ("y1", "present_k1", "present_v1", "y2"):
        b.output(out, typed=False)
    return _model(b)


# llvm only: MultiHeadAttention composes the kernels GroupQueryAttention's test runs
# through the c backend too, and the suite is at its time bound.
@pytest.mark.parametrize("target", ["llvm"])
def test_multi_head_attention_matches_onnxruntime(target: str) -> None:
    model = mha_model()
    exe = kiln.compile(from_onnx(model), target)
    rng = np.random.default_rng(43)
    for batch, seq, past, kv in ((2, 3, 0, 4), (2, 1, 4, 1), (1, 4, 2, 3)):
        sizes = {"batch": batch, "seq": seq, "past": past, "kv": kv, "total": past + seq}
        feeds = {i.name: rng.standard_normal(
            [d.dim_value or sizes[d.dim_param] for d in i.type.tensor_type.shape.dim]
        ).astype(np.float32) for i in model.graph.input}
        feeds["mask1"] = (rng.uniform(size=(batch, past + seq)) > 0.3).astype(np.int32)
        feeds["mask1"][:, 0] = 1
        feeds["lengths2"] = rng.integers(1, kv + 1, batch).astype(np.int32)
        want = onnxruntime_outputs(model, feeds)
        got = exe["main"](*feeds.values())
        for out, g, w in zip(model.graph.output, got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{out.name} {batch}x{seq} past {past}")


def test_unsupported_multi_head_attention_is_refused() -> None:
    """Packed QKV (onnxruntime's CPU kernel refuses it too) and the (3 * batch + 2) mask."""
    b = GraphBuilder(seed=2)
    b.node("MultiHeadAttention", [b.input("q", ["batch", "seq", 2, 3, 16])], ["y"],
           domain=MS, num_heads=2, name="mha")
    b.output("y", ["batch", "seq", 32])
    with pytest.raises(FrontendError, match=r"mha.*packed QKV or packed KV is not supported"):
        from_onnx(_model(b))
    b = GraphBuilder(seed=2)
    b.node("MultiHeadAttention", [b.input("q", ["batch", "seq", 32]),
                                  b.input("k", ["batch", "seq", 32]),
                                  b.input("v", ["batch", "seq", 32]), "",
                                  b.input("m", ["pad"], TensorProto.INT32)], ["y"],
           domain=MS, num_heads=2, name="mha")
    b.output("y", ["batch", "seq", 32])
    with pytest.raises(FrontendError, match=r"mha.*the \(3 \* batch \+ 2\) form"):
        from_onnx(_model(b))
