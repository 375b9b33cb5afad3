"""IR built by hand (IRBuilder and node constructors) prints and parses back exactly."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from dsl_strict_equal import assert_roundtrip_equal

from kiln.errors import IRError
from kiln.ir import IRBuilder, TensorType, TupleType
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.script import from_source, load_metadata, print_func, print_module


def roundtrip(mod: IRModule, **kwargs: object) -> str:
    text = print_module(mod, **kwargs)  # type: ignore[arg-type]
    ast.parse(text)  # printed text is valid Python
    again = from_source(text, metadata=getattr(text, "metadata", None) or None)
    assert_roundtrip_equal(again, mod)
    assert print_module(again, **kwargs) == text  # type: ignore[arg-type]
    return text


def prim(body_fn, *params: t.Param, attrs: dict | None = None) -> IRModule:  # type: ignore[no-untyped-def, type-arg]
    return IRModule({"f": t.PrimFunc(params, body_fn, attrs or {})})


def test_duplicate_and_invalid_name_hints_become_unique_valid_names() -> None:
    A = t.Buffer("A", (4, 4), "float32")
    i1, i2, bad, kw, ns = (t.Var("i"), t.Var("i"), t.Var("x.1"), t.Var("for"), t.Var("T"))
    empty = t.Var("")
    inner = t.For(i2, t.const(0), t.const(4), "serial", t.Store(A, t.const(1.0), (i1, i2)))
    body = t.For(i1, t.const(0), t.const(4), "serial", t.seq(
        t.LetStmt(bad, i1 + 1), t.LetStmt(kw, bad * 2), t.LetStmt(ns, kw),
        t.LetStmt(empty, ns), inner))
    text = roundtrip(prim(body, A))
    assert "for i in T.serial(4):" in text and "for i_1 in T.serial(4):" in text
    assert "x_1 = T.let(" in text and "for_ = T.let(" in text and "T_1 = T.let(" in text
    assert "v = T.let(" in text
    assert "A[i, i_1] = T.float32(1.0)" in text


def test_function_names_that_are_keywords_or_dsl_names() -> None:
    def f() -> t.PrimFunc:
        X = t.Buffer("X", (1,), "int8")
        return t.PrimFunc((X,), t.Store(X, t.Const(1, "int8"), (t.const(0),)))

    mod = IRModule({"for": f(), "T": f(), "meta": f()})
    text = roundtrip(mod)
    assert '@T.prim_func(name="for")' in text and '@T.prim_func(name="T")' in text


def test_every_operator_precedence_survives() -> None:
    a, b, c = t.Var("a"), t.Var("b"), t.Var("c")
    f = t.Var("f", "float32")
    bl = t.Var("p", "bool")
    exprs: list[t.PrimExpr] = [
        (a + b) * c, a + b * c, a - (b - c), (a - b) - c, a // (b // c), (a % b) % c,
        t.BinaryOp("pow", t.BinaryOp("pow", a, b), c),
        t.BinaryOp("pow", a, t.BinaryOp("pow", b, c)),
        t.BinaryOp("pow", -a, b), t.BinaryOp("pow", a, -b), -(a + b), t.UnaryOp("neg", -a),
        ~(a & b),
        -t.BinaryOp("pow", a, b), (a << b) >> c, a << (b >> c), (a | b) & c, a | (b & c),
        (a ^ b) ^ c, a ^ (b ^ c), t.UnaryOp("neg", t.const(3)), t.const(-3) * a,
        t.BinaryOp("pow", t.const(-2), a), a - t.const(-3),
        t.BinaryOp("add", t.const(2), t.const(3)),
        t.BinaryOp("div", t.const(7), t.const(2)), t.BinaryOp("mod", a, b),
        t.BinaryOp("floormod", t.const(-7), t.const(2)), t.min_(t.const(1), t.const(2)),
        t.select(bl, a, t.const(0)), t.Cast("int64", f / f * f), t.Cast("int64", f / (f * f)),
    ]
    bools: list[t.PrimExpr] = [
        (a < b).eq(b < c), (a < b) & (b < c), ~bl, t.UnaryOp("not", t.Const(True, "bool")),
        t.compare("le", t.const(1), t.const(2)), (a + b).ne(c), t.BinaryOp("xor", bl, bl).eq(bl),
        t.intrin("isnan", f), t.Const(False, "bool"),
    ]
    out = t.Buffer("out", (len(exprs),), "int64")
    outb = t.Buffer("outb", (len(bools),), "bool")
    stmts = [t.Store(out, e, (t.const(k),)) for k, e in enumerate(exprs)]
    stmts += [t.Store(outb, e, (t.const(k),)) for k, e in enumerate(bools)]
    text = roundtrip(prim(t.seq(*stmts), out, outb, a, b, c, f, bl))
    assert "out[0] = (a + b) * c" in text
    assert "out[2] = a - (b - c)" in text
    assert "T.int64(2) + 3" in text  # two bare literals would be folded by the parser
    assert "-T.int64(3)" in text and "out[22] = (-2) ** a" in text


def test_literal_dtypes_are_exact() -> None:
    x8, xf = t.Var("x8", "int8"), t.Var("xf", "float16")
    values = [
        t.Const(1, "int8") + x8, x8 * t.Const(-128, "int8"), t.Cast("int8", t.Const(7, "int64")),
        t.Cast("int8", t.Const(2**64 - 1, "uint64")), t.Cast("int8", t.Const(0.1, "float32")),
        t.Cast("int8", xf + t.Const(65504.0, "float16")), t.Cast("int8", t.Const(1.0, "bfloat16")),
    ]
    out = t.Buffer("o", (len(values),), "int8")
    body = t.seq(*(t.Store(out, v, (t.Const(k, "int32"),)) for k, v in enumerate(values)))
    text = roundtrip(prim(body, out, x8, xf))
    assert "o[T.int32(0)] = T.int8(1) + x8" in text
    assert "T.uint64(18446744073709551615)" in text


@pytest.mark.parametrize("value", [
    0.1, -0.0, 1e-45, float(np.float32(0.1)), float(np.float32(3.4028235e38)), 1.0 / 3.0,
    float("inf"), float("-inf"), float("nan"), 5e-324, 2.0**70, -123456.789,
])
def test_float_constants_print_exactly(value: float) -> None:
    out = t.Buffer("o", (2,), "float64")
    body = t.seq(t.Store(out, t.Const(value, "float64"), (t.const(0),)),
                 t.Store(out, t.Cast("float64", t.Const(value, "float32")), (t.const(1),)))
    roundtrip(prim(body, out))


def test_store_of_mismatched_dtype_literal_is_kept() -> None:
    # Ill-typed but printable and parseable: the typed literal says what it is.
    out = t.Buffer("o", (1,), "int32")
    text = roundtrip(prim(t.Store(out, t.const(5), (t.const(0),)), out))
    assert "o[0] = T.int64(5)" in text


def test_loops_of_every_form() -> None:
    A = t.Buffer("A", (16,), "float32")
    n = t.Var("n")
    i32 = t.Var("k", "int32")
    zero = t.Store(A, t.const(0.0), (t.const(0),))
    loops = [
        t.For(t.Var("i"), t.const(0), t.const(16), "serial", zero),
        t.For(t.Var("i"), t.const(2), t.const(5), "parallel", zero),
        t.For(t.Var("i"), t.const(1), n - 1, "vectorized", zero),
        t.For(t.Var("i"), t.const(0), n, "unrolled", zero),
        t.For(i32, t.Const(0, "int32"), t.Const(4, "int32"), "serial",
              t.Store(A, t.const(0.0), (t.Cast("int64", i32),))),
        # the loop variable's dtype differs from its bounds
        t.For(t.Var("m", "int32"), t.const(0), t.const(4), "serial", t.SeqStmt(())),
        t.For(t.Var("z"), t.const(0), t.Const(4, "int32"), "serial", t.SeqStmt(())),
        t.For(t.Var("w"), n, t.const(3), "serial", t.SeqStmt(())),
    ]
    text = roundtrip(prim(t.seq(*loops), A, n))
    assert "T.parallel(2, 7)" in text and "T.vectorized(1, extent=n - 1)" in text
    assert 'T.serial(0, extent=4, dtype="int32")' in text
    assert "T.serial(T.int32(0), T.int32(4))" in text


def test_every_statement_kind_with_unusual_fields() -> None:
    n = t.Var("n")
    A = t.Buffer("A", (n, 4), "float32")  # shape names a parameter that comes later
    L = t.Buffer("L", (4,), "int32", "local")
    ib_view = t.Buffer("view", (2,), "float32", "local")
    W = t.Buffer("W", (4,), "float32", "local")  # bound to 2x2 data, other shape and scope
    wdata = np.arange(4, dtype=np.float16).reshape(2, 2)
    x = t.Var("x", "int32")
    body = t.seq(
        t.seq(t.Allocate(L), t.seq(
            t.LetStmt(x, t.const(3)), t.Store(L, x, (t.const(0),)),  # var dtype != value dtype
            t.DeclBuffer(ib_view, L, 8),
            t.Store(ib_view, t.Const(1.5, "float32"), (t.const(1),)),
        )),
        t.seq(t.AllocConst(W, wdata), t.Store(A, W[0], (t.const(0), t.const(0)))),
        t.IfThenElse(n > 2, t.Evaluate(t.const(0)), t.IfThenElse(n > 1, t.SeqStmt(()))),
        t.IfThenElse(n < 0, t.SeqStmt(()), None),
        t.Evaluate(t.CallExtern("puts", (A, n, t.Const(1.0, "float64")), "int32", None)),
        t.Evaluate(t.CallExtern("f", (), "int8", t.ExternDependency(
            "lib", "1.2", "http://x", "git", ("-la", "-lb")))),
        t.CallFunc("g", (A, n + 1, t.Const(2, "uint8"))),
        t.CallFunc("h", ()),
    )
    text = roundtrip(prim(body, A, n, attrs={"a": [1, 2.5, "s", None, (True,)], "b": {}}))
    assert 'W = T.alloc_const([[0.0, 1.0], [2.0, 3.0]], "float16", buffer_shape=(4,), ' \
           'buffer_dtype="float32", scope="local")' in text
    assert "elif n > 1:" in text
    assert 'x = T.let(3, dtype="int32")' in text


def test_empty_bodies_and_pass() -> None:
    mod = prim(t.SeqStmt(()))
    text = roundtrip(mod)
    assert text.rstrip().endswith("def f():\n        pass")


def test_nested_and_single_sequences_print_flattened() -> None:
    """The builder canonicalizes sequences: nested SeqStmts flatten (a documented limit)."""
    A = t.Buffer("A", (1,), "int64")
    s = t.Store(A, t.const(1), (t.const(0),))
    mod = prim(t.SeqStmt((t.SeqStmt((s, s)), s)), A)
    again = from_source(print_module(mod))
    body = again["f"].body  # type: ignore[union-attr]
    assert isinstance(body, t.SeqStmt) and len(body.body) == 3


def test_graph_level_every_expression() -> None:
    ib = IRBuilder()
    with ib.function("main", {"x": 1}):
        x = ib.param("x", TensorType((2, 3), "float32"))
        tp = ib.param("t", TupleType((TensorType((2,), "int64"), TupleType(()))))
        c = g.Constant(np.ones((2, 3), np.float32))  # unnamed, 6 elements: inline
        big = g.Constant(np.arange(40, dtype=np.int32).reshape(5, 8), "weights/0")
        y = ib.emit(g.Call("add", (x, c), {"alpha": 1.5, "mode": "x", "ret": 3}, x.type), "y")
        z = ib.emit(g.Call("nop", (g.Call("inner", (y,), {}, x.type), big, big), {}, x.type), "y")
        tup = ib.emit(g.Tuple((y, z, g.Tuple(()))), "tup")
        first = ib.emit(g.TupleGetItem(tp, 0), "first")
        ct = ib.emit(g.CallTensor("k", (first, g.Tuple((x,))), TupleType((x.type, x.type))), "ct")
        ib.ret(g.Tuple((tup, ct, g.TupleGetItem(ct, 1), first)))
    mod = ib.get()
    text = roundtrip(mod)
    assert 'G.const(meta["weights_0"], name="weights/0")' in text
    assert text.count('"weights_0": {') == 1  # a shared array is stored once
    assert 'attrs={"alpha": 1.5, "mode": "x", "ret": 3}' in text
    assert "y_1: G.Tensor((2, 3), \"float32\") = G.op(\"nop\", G.op(\"inner\", y, " \
           "ret=G.Tensor((2, 3), \"float32\"))" in text


def test_graph_call_with_ret_differing_from_binding_type() -> None:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", TensorType((2,), "float32"))
        v = g.Var("v", TensorType((2,), "float32"))
        ib.emit(g.Call("f", (x,), {}, TensorType((2,), "float16")), var=v)
        ib.ret(v)
    text = print_module(ib.get())
    assert 'ret=G.Tensor((2,), "float16")' in text
    with pytest.raises(IRError, match="does not match its value's type"):
        from_source(text)


def test_metadata_modes_and_npz_side_file(tmp_path: object) -> None:
    weights = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    ib = IRBuilder()
    with ib.prim_func("k"):
        Y = ib.arg("Y", (8, 8), "float32")
        with ib.alloc_const("W", weights) as W, ib.for_range(8) as i, ib.for_range(8) as j:
            ib.store(Y, [i, j], W[i, j])
    with ib.function("main"):
        x = ib.param("x", TensorType((8, 8), "float32"))
        c = ib.emit(g.Constant(weights, "w"), "c")
        ib.ret(g.Tuple((x, c, g.Constant(np.float32(2.0)))))
    mod = ib.get()

    auto = roundtrip(mod)
    assert 'T.alloc_const(meta["W"])' in auto and "meta = {" in auto and auto.metadata == {}
    inline = roundtrip(mod, metadata="inline")
    assert "meta" not in inline and "[-1.0, " in inline

    ref = print_module(mod, metadata="reference")
    assert "meta = {" not in ref and set(ref.metadata) == {"W", "w"}
    with pytest.raises(IRError, match=r"meta\['W'\] is not in the metadata"):
        from_source(ref)
    path = f"{tmp_path}/consts.npz"
    ref.save_metadata(path)
    assert set(load_metadata(path)) == {"W", "w"}
    for md in (ref.metadata, path):
        assert_roundtrip_equal(from_source(ref, metadata=md), mod)

    everything = print_module(mod, metadata="reference", inline_limit=-1)
    assert "G.const(2.0" not in everything and len(everything.metadata) == 3


def test_constant_arrays_of_every_dtype() -> None:
    arrays = [
        np.array([True, False, True]), np.array([-128, 127], np.int8),
        np.array([2**64 - 1, 0], np.uint64), np.array([[1.5, -0.0], [np.inf, np.nan]], np.float32),
        np.array([0.1, 1e-300], np.float64), np.array(65504.0, np.float16),
        np.zeros((0, 3), np.int32),
        np.zeros((2, 0), np.float32), np.zeros((0,), np.uint8),
        np.arange(30, dtype=np.int16).reshape(2, 3, 5),
    ]
    import ml_dtypes

    arrays.append(np.array([1.0, -3.5, 1e38], dtype=ml_dtypes.bfloat16))
    ib = IRBuilder()
    with ib.function("main"):
        ib.ret(g.Tuple(tuple(g.Constant(a) for a in arrays)))
    mod = ib.get()
    for mode in ("auto", "inline"):
        for limit in (0, 16, 1000):
            roundtrip(mod, metadata=mode, inline_limit=limit)


def test_print_func_and_module_attrs() -> None:
    X = t.Buffer("X", (2,), "float32")
    f = t.PrimFunc((X,), t.Store(X, t.const(0.0), (t.const(0),)), {"k": "v"})
    text = print_func(f, "zero")
    assert text.startswith("from kiln.script import G, T\n")
    mod = from_source(text)
    assert list(mod) == ["zero"]
    assert_roundtrip_equal(mod, IRModule({"zero": f}))
    attrs = IRModule({"zero": f}, {"n": 1, "list": [1, [2]], "tuple": (), "f": float("nan")})
    roundtrip(attrs)
    assert roundtrip(IRModule()).rstrip().endswith("class Module:\n    pass")


def test_printer_rejects_what_it_cannot_print() -> None:
    with pytest.raises(IRError, match="unknown metadata mode"):
        print_module(IRModule(), metadata="bogus")
    with pytest.raises(IRError, match="expects an IRModule"):
        print_module("x")  # type: ignore[arg-type]
    X = t.Buffer("X", (1,), "int64")
    f = t.PrimFunc((X,), t.Store(X, t.const(0), (t.const(0),)), {"obj": object()})
    with pytest.raises(IRError, match="cannot print attribute value"):
        print_module(IRModule({"f": f}))


def test_declarations_print_flat_and_the_with_form_still_parses() -> None:
    """`buf = T.allocate(...)` is a statement scoped to the rest of its block; the older
    `with T.allocate(...) as buf:` spelling parses into the same flat IR."""
    flat = from_source('''
@T.prim_func
def f(X: T.Buffer((4,), "float32"), Y: T.Buffer((4,), "float32")):
    arena = T.allocate((32,), "uint8", scope="global")
    W = T.alloc_const([1.0, 2.0, 3.0, 4.0], "float32")
    v = T.decl_buffer((4,), "float32", source=arena, byte_offset=16)
    for i in T.serial(4):
        acc = T.allocate((1,), "float32", scope="local")
        acc[0] = X[i] * W[i]
        v[i] = acc[0]
    for i in T.serial(4):
        Y[i] = v[i]
''')
    nested = from_source('''
@T.prim_func
def f(X: T.Buffer((4,), "float32"), Y: T.Buffer((4,), "float32")):
    with T.allocate((32,), "uint8", scope="global") as arena:
        with T.alloc_const([1.0, 2.0, 3.0, 4.0], "float32") as W, \\
                T.decl_buffer((4,), "float32", source=arena, byte_offset=16) as v:
            for i in T.serial(4):
                with T.allocate((1,), "float32", scope="local") as acc:
                    acc[0] = X[i] * W[i]
                    v[i] = acc[0]
            for i in T.serial(4):
                Y[i] = v[i]
''')
    assert_roundtrip_equal(nested, flat)
    body = flat["f"].body
    assert isinstance(body, t.SeqStmt)
    assert [type(s).__name__ for s in body.body] == [
        "Allocate", "AllocConst", "DeclBuffer", "For", "For"]
    text = roundtrip(flat)
    assert "    v = T.decl_buffer((4,), \"float32\", source=arena, byte_offset=16)\n" in text
    assert "        acc = T.allocate((1,), \"float32\", scope=\"local\")\n" in text
    assert "with T.allocate" not in text
