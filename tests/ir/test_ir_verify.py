"""The verifier: each kind of ill-formed IR gets a message naming the node, quoting the IR."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import IRError
from kiln.ir import IRBuilder, IRModule, TensorType, TupleType, verify
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.tensor import Buffer, Const, For, PrimFunc, Store, Var, const, seq

F32 = TensorType((4,), "float32")


def fails(mod_or_func: object, *fragments: str) -> str:
    with pytest.raises(IRError) as info:
        verify(mod_or_func)  # type: ignore[arg-type]
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    return message


def prim(body: t.Stmt, *params: t.Param) -> IRModule:
    return IRModule({"f": PrimFunc(params, body)})


def loop(var: Var, extent: int, body: t.Stmt) -> For:
    return For(var, const(0, var.dtype), const(extent, var.dtype), "serial", body)


X = Buffer("X", (4,), "float32")
Y = Buffer("Y", (4,), "float32")


# --------------------------------------------------------------------------- scopes


def test_well_formed_module_passes() -> None:
    i = Var("i")
    verify(prim(loop(i, 4, Store(Y, X[i] + 1.0, (i,))), X, Y))


def test_use_before_definition() -> None:
    i, v = Var("i"), Var("v", "float32")
    body = loop(i, 4, seq(Store(Y, v, (i,)), t.LetStmt(v, X[i]), Store(Y, v, (i,))))
    message = fails(prim(body, X, Y), "function 'f': use of variable 'v' before its definition")
    # The faulty statement is quoted and marked.
    assert ">" in message and "Y[i] = v" in message
    marked = [line for line in message.splitlines() if line.lstrip().startswith(">")]
    assert marked == [line for line in marked if "Y[i] = v" in line]


def test_use_outside_scope_buffer() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        A = ib.arg("A", (4,), "float32")
        B = ib.arg("B", (4,), "float32")
        # A declaration's scope is the rest of its block: here the loop body.
        with ib.for_range(4) as i:
            T = ib.declare_allocate("T", (4,), "float32")
            ib.store(T, [i], A[i])
        with ib.for_range(4) as j:
            ib.store(B, [j], T[j] * 2.0)
    message = fails(ib.get(), "function 'f': use of buffer 'T' outside its scope "
                              "(its Allocate ended)", "at: T_1[i_1]")
    # Quoted as DSL text: the buffer hint `T` is the DSL's namespace, so it prints `T_1`.
    assert "> 7 |         B[i_1] = T_1[i_1] * T.float32(2.0)" in message


def test_declaration_scope_is_the_rest_of_its_block() -> None:
    """Used before its declaration in the same list, or after its list ended: both caught;
    used after it in the same flat list: fine."""
    T = Buffer("T", (4,), "float32")
    i = Var("i")
    ok = seq(t.Allocate(T), loop(i, 4, Store(T, X[i], (i,))), loop(i, 4, Store(Y, T[i], (i,))))
    verify(prim(ok, X, Y))
    early = seq(loop(i, 4, Store(Y, T[i], (i,))), t.Allocate(T))
    fails(prim(early, X, Y), "use of buffer 'T' before its definition")
    # (t.seq would splice the inner list and widen T's scope: build the nesting by hand.)
    inner = t.SeqStmt((t.SeqStmt((t.Allocate(T), Store(T, X[0], (const(0),)))),
                       Store(Y, T[0], (const(0),))))
    fails(prim(inner, X, Y), "use of buffer 'T' outside its scope (its Allocate ended)")
    twice = seq(t.Allocate(T), t.Allocate(T), Store(Y, X[0], (const(0),)))
    fails(prim(twice, X, Y), "redefinition of buffer 'T' by a Allocate")


def test_loop_variable_outside_its_loop() -> None:
    i = Var("i")
    body = seq(loop(i, 4, Store(Y, X[i], (i,))), Store(Y, X[i], (i,)))
    fails(prim(body, X, Y), "use of variable 'i' outside its scope (its loop ended)")


def test_undefined_variable_and_buffer() -> None:
    i, n = Var("i"), Var("n")
    fails(prim(loop(i, 4, Store(Y, X[n], (i,))), X, Y),
          "undefined variable 'n': not a parameter, loop variable, let binding or "
          "allocation of function 'f'")
    Z = Buffer("Z", (4,), "float32")
    fails(prim(loop(i, 4, Store(Z, X[i], (i,))), X, Y), "undefined buffer 'Z'")


def test_redefinition_of_bound_variable() -> None:
    i = Var("i")
    body = loop(i, 4, loop(i, 4, Store(Y, X[i], (i,))))
    fails(prim(body, X, Y), "redefinition of variable 'i' by a loop: it is already bound by "
                            "an enclosing loop")
    fails(prim(seq(t.Allocate(X), Store(X, const(1.0, "float32"), (const(0),))), X),
          "redefinition of buffer 'X' by a Allocate")
    fails(prim(Store(X, const(1.0, "float32"), (const(0),)), X, X),
          "parameter 1 'X' appears twice")


def test_sibling_loops_may_reuse_a_variable() -> None:
    i = Var("i")
    verify(prim(seq(loop(i, 4, Store(Y, X[i], (i,))), loop(i, 4, Store(X, Y[i], (i,)))), X, Y))


# --------------------------------------------------------------------------- dtypes


def test_wrong_dtype_in_store() -> None:
    i = Var("i")
    body = loop(i, 4, Store(Y, t.Cast("float64", X[i]), (i,)))
    message = fails(prim(body, X, Y),
                    "Store to buffer 'Y': value dtype float64 differs from the buffer dtype "
                    "float32; insert a Cast", 'at: T.cast(X[i], "float64")')
    assert '> 4 |         Y[i] = T.cast(X[i], "float64")' in message


def test_index_count_and_dtype() -> None:
    i = Var("i")
    M = Buffer("M", (4, 4), "float32")
    fails(prim(loop(i, 4, Store(Y, M[i], (i,))), M, Y),
          "Load of buffer 'M' has 1 index but the buffer has 2 dimension(s) (shape (4, 4))")
    fails(prim(loop(i, 4, Store(Y, X[i], (i, i))), X, Y),
          "Store of buffer 'Y' has 2 indices but the buffer has 1 dimension(s)")
    f = Var("f", "float32")
    body = seq(t.LetStmt(f, const(0.0, "float32")), Store(Y, t.Load(X, (f,)), (const(0),)))
    fails(prim(body, X, Y), "index 0 of Load of buffer 'X' has dtype float32; indices must be "
                            "integers")


def test_operand_dtypes() -> None:
    i = Var("i")
    bad = t.BinaryOp("add", X[i], t.Cast("float64", X[i]))
    fails(prim(loop(i, 4, Store(Y, bad, (i,))), X, Y),
          "operands of 'add' have different dtypes (float32 vs float64); insert a Cast")
    fails(prim(loop(i, 4, Store(Y, t.BinaryOp("shl", X[i], X[i]), (i,))), X, Y),
          "'shl' is not defined on floats (float32)")
    B = Buffer("B", (4,), "bool")
    fails(prim(loop(i, 4, Store(B, t.BinaryOp("add", B[i], B[i]), (i,))), B),
          "'add' is not defined on bool; cast to an integer first")
    fails(prim(loop(i, 4, Store(B, t.Compare("lt", X[i], const(1, "int32")), (i,))), X, B),
          "operands of comparison 'lt' have different dtypes")
    fails(prim(loop(i, 4, Store(Y, t.UnaryOp("not", X[i]), (i,))), X, Y),
          "'not' is not defined on floats")


def test_conditions_must_be_bool() -> None:
    i = Var("i")
    fails(prim(loop(i, 4, t.IfThenElse(i, Store(Y, X[i], (i,)))), X, Y),
          "if condition has dtype int64; it must be bool")
    sel = t.Select(i, X[i], X[i])
    fails(prim(loop(i, 4, Store(Y, sel, (i,))), X, Y),
          "Select condition has dtype int64; it must be bool")
    sel = t.Select(i < 2, X[i], t.Cast("float64", X[i]))
    fails(prim(loop(i, 4, Store(Y, sel, (i,))), X, Y), "Select branches have different dtypes")


def test_loop_variable_dtype() -> None:
    f = Var("f", "float32")
    body = For(f, const(0.0, "float32"), const(4.0, "float32"), "serial",
               Store(Y, f, (const(0),)))
    fails(prim(body, Y), "loop variable 'f' has dtype float32; loop variables must be integers")
    i = Var("i", "int32")
    body = For(i, const(0), const(4, "int32"), "serial", Store(Y, X[i], (i,)))
    fails(prim(body, X, Y), "loop start has dtype int64 but loop variable 'i' is int32")


def test_let_intrinsic_and_constant_dtypes() -> None:
    v = Var("v", "int32")
    fails(prim(seq(t.LetStmt(v, const(1)), Store(Y, const(1.0, "float32"), (const(0),))), Y),
          "let 'v': value dtype int64 differs from the variable dtype int32")
    i = Var("i")
    fails(prim(loop(i, 4, Store(Y, t.Cast("float32", t.Intrin("exp", (i,))), (i,))), Y),
          "intrinsic 'exp' needs a float argument, got int64")
    fails(prim(Store(Buffer("B", (1,), "int8"), Const(300, "int8"), (const(0),)),
               Buffer("B", (1,), "int8")), "undefined buffer 'B'")
    B8 = Buffer("B", (1,), "int8")
    fails(prim(Store(B8, Const(300, "int8"), (const(0),)), B8),
          "constant 300 does not fit dtype int8")


# --------------------------------------------------------------------------- calls


def callee_module(call: t.Stmt, *caller_params: t.Param) -> IRModule:
    A = Buffer("A", (4,), "float32")
    B = Buffer("B", (4,), "float32")
    s = Var("s", "float32")
    i = Var("i")
    callee = PrimFunc((A, B, s), loop(i, 4, Store(B, A[i] * s, (i,))))
    return IRModule({"scale": callee, "caller": PrimFunc(caller_params, call)})


def test_call_func_wrong_arity() -> None:
    mod = callee_module(t.CallFunc("scale", (X,)), X, Y)
    message = fails(mod, "function 'caller': CallFunc to 'scale' passes 1 argument(s) but it "
                         "takes 3 (A, B, s)")
    assert '> 3 |     T.call_func("scale", [X])' in message


def test_call_func_missing_kinds_shapes_dtypes() -> None:
    two = const(2.0, "float32")
    fails(callee_module(t.CallFunc("scael", (X, Y, two)), X, Y),
          "CallFunc to missing function 'scael'. did you mean 'scale'?")
    fails(callee_module(t.CallFunc("scale", (X, two, two)), X, Y),
          "argument 1 for parameter 'B' must be a buffer, got a scalar expression")
    fails(callee_module(t.CallFunc("scale", (X, Y, Y)), X, Y),
          "argument 2 for parameter 's' must be a scalar of dtype float32, got buffer 'Y'")
    Z = Buffer("Z", (5,), "float32")
    fails(callee_module(t.CallFunc("scale", (X, Z, two)), X, Z),
          "buffer 'Z' has shape (5,), expected (4,)")
    W = Buffer("W", (4,), "int32")
    fails(callee_module(t.CallFunc("scale", (X, W, two)), X, W),
          "buffer 'W' has dtype int32, expected float32")
    fails(callee_module(t.CallFunc("scale", (X, Y, const(2))), X, Y),
          "argument 2 for parameter 's' has dtype int64, expected float32")
    verify(callee_module(t.CallFunc("scale", (X, Y, two)), X, Y))
    # A lone function cannot see its callees: the call is not checked.
    verify(callee_module(t.CallFunc("nope", (X,)), X, Y)["caller"])


def test_verify_changes_walks_what_a_late_pass_changed() -> None:
    """verify_changes (the compiler's check after a late pass): the functions a pass left
    as they were are not walked again, but a caller of a function whose parameters
    changed is, and a removed function verifies the whole module."""
    from kiln.ir.verify import verify_changes

    two = const(2.0, "float32")
    before = callee_module(t.CallFunc("scale", (X, Y, two)), X, Y)
    verify(before)
    # an unchanged function is trusted (this one, handed in unverified, would fail)
    i = Var("i")
    bad = PrimFunc((X,), loop(i, 4, Store(Y, X[i], (i,))))
    trusted = IRModule({**before.functions, "bad": bad})
    verify_changes(IRModule({**trusted.functions, "new": PrimFunc((X,), seq())}), trusted)
    # ... but not when a function of the module it came from is gone
    with pytest.raises(IRError, match="CallFunc to missing function 'scale'"):
        verify_changes(IRModule({n: f for n, f in trusted.functions.items() if n != "scale"}),
                       trusted)
    # a callee whose parameters changed: its unchanged caller is verified again
    A, s = Buffer("A", (4,), "float32"), Var("s", "float32")
    fewer = PrimFunc((A, s), loop(i, 4, Store(A, A[i] * s, (i,))))
    with pytest.raises(IRError, match="CallFunc to 'scale' passes 3 argument"):
        verify_changes(before.with_function("scale", fewer), before)
    # the same parameters, another body: the caller is not walked, the callee is
    scale = before["scale"]
    assert isinstance(scale, PrimFunc)
    verify_changes(before.with_function("scale", scale.with_body(scale.body)), before)
    with pytest.raises(IRError, match="undefined buffer 'Y'"):
        verify_changes(before.with_function("scale", PrimFunc(scale.params, bad.body)), before)


def graph_module(call: g.Expr, *, n_params: int = 2) -> IRModule:
    A = Buffer("A", (4,), "float32")
    B = Buffer("B", (4,), "float32")
    i = Var("i")
    kernel = PrimFunc((A, B), loop(i, 4, Store(B, A[i], (i,))))
    x = g.Var("x", F32)
    y = g.Var("y", call.type)
    main = g.Function((x,), (g.Binding(y, call),), y)
    _ = n_params
    return IRModule({"copy": kernel, "main": main})


def test_call_tensor_checks() -> None:
    x = g.Var("x", F32)

    def with_call(call: g.CallTensor) -> IRModule:
        mod = graph_module(g.CallTensor("copy", (x,), F32))
        y = g.Var("y", call.type)
        return mod.with_function("main", g.Function((x,), (g.Binding(y, call),), y))

    verify(with_call(g.CallTensor("copy", (x,), F32)))
    fails(with_call(g.CallTensor("cpy", (x,), F32)),
          "function 'main': CallTensor to missing PrimFunc 'cpy'. did you mean 'copy'?")
    fails(with_call(g.CallTensor("copy", (x, x), F32)),
          "CallTensor to 'copy' passes 2 argument(s) + 1 output(s) = 3, but it takes 2 "
          "parameters (A, B)")
    fails(with_call(g.CallTensor("copy", (x,), TensorType((5,), "float32"))),
          "output 0 for parameter 'B' has shape (5,), expected (4,)")
    fails(with_call(g.CallTensor("copy", (x,), TensorType((4,), "int8"))),
          "output 0 for parameter 'B' has dtype int8, expected float32")


def test_graph_scopes_and_types() -> None:
    x = g.Var("x", F32)
    y = g.Var("y", F32)
    z = g.Var("z", F32)
    early = g.Function((x,), (g.Binding(z, g.CallTensor("copy", (y,), F32)),
                              g.Binding(y, g.CallTensor("copy", (x,), F32))), z)
    message = fails(IRModule({"main": early}),
                    "function 'main': graph variable 'y' is used before its definition")
    assert ('> 3 |     z: G.Tensor((4,), "float32") = G.call_tensor("copy", [y], '
            'G.Tensor((4,), "float32"))') in message
    pair = g.Var("pair", TupleType((F32, F32)))
    bad_index = g.Function((x,), (g.Binding(pair, g.Tuple((x, x))),
                                  g.Binding(y, g.TupleGetItem(pair, 2))), y)
    fails(IRModule({"main": bad_index}),
          "TupleGetItem index 2 is out of range for a tuple of 2 field(s)")
    wrong_type = g.Function((x,), (g.Binding(g.Var("w", TensorType((4,), "int8")), x),), x)
    fails(IRModule({"main": wrong_type}),
          "binding 'w' is declared Tensor((4,), 'int8') but its value has type "
          "Tensor((4,), 'float32')")
    twice = g.Function((x,), (g.Binding(y, x), g.Binding(y, x)), y)
    fails(IRModule({"main": twice}), "redefinition of variable 'y'")
    B = Buffer("B", (4,), "float32")
    scalar = PrimFunc((Var("n"), B), Store(B, const(0.0, "float32"), (const(0),)))
    call = g.Function((x,), (g.Binding(y, g.CallTensor("s", (x,), F32)),), y)
    fails(IRModule({"s": scalar, "main": call}),
          "the parameter is a scalar; CallTensor passes tensors only")


# --------------------------------------------------------------------------- memory


def test_alloc_const_mismatch() -> None:
    W = Buffer("W", (2, 2), "float32")
    body = Store(Y, W[const(0), const(0)], (const(0),))
    fails(prim(seq(t.AllocConst(W, np.zeros((2, 3), np.float32)), body), Y),
          "AllocConst buffer 'W' has shape (2, 2) but its data has shape (2, 3)")
    fails(prim(seq(t.AllocConst(W, np.zeros((2, 2), np.float64)), body), Y),
          "AllocConst buffer 'W' has dtype float32 but its data is float64")
    store = Store(W, const(1.0, "float32"), (const(0), const(0)))
    fails(prim(seq(t.AllocConst(W, np.zeros((2, 2), np.float32)), store), Y),
          "store to constant buffer 'W' (AllocConst data is read-only)")


def test_decl_buffer_bounds() -> None:
    arena = Buffer("arena", (16,), "uint8")
    view = Buffer("view", (4,), "float32")
    body = Store(view, const(0.0, "float32"), (const(0),))
    verify(prim(seq(t.Allocate(arena), seq(t.DeclBuffer(view, arena, 0), body))))
    fails(prim(seq(t.Allocate(arena), seq(t.DeclBuffer(view, arena, 4), body))),
          "DeclBuffer 'view' covers bytes [4, 20) but its source 'arena' has 16 bytes")
    small = Buffer("view", (2,), "float32")
    fails(prim(seq(t.Allocate(arena), seq(t.DeclBuffer(small, arena, 2), Store(
        small, const(0.0, "float32"), (const(0),))))),
        "DeclBuffer 'view' starts at byte 2, not a multiple of its element size 4")


def test_local_allocation_too_large_for_the_stack() -> None:
    big = Buffer("scratch", (128, 256), "float32", "local")
    body = seq(t.Allocate(big), Store(big, const(0.0, "float32"), (const(0), const(0))))
    fails(prim(body), "Allocate of buffer 'scratch' in scope 'local' needs 131072 bytes, more "
                      "than the 65536-byte stack limit; use scope \"global\" (heap) instead")
    ok = Buffer("scratch", (128, 256), "float32", "global")
    verify(prim(seq(t.Allocate(ok), Store(ok, const(0.0, "float32"), (const(0), const(0))))))


def test_lowering_output_attributes() -> None:
    body = Store(Y, X[const(0)], (const(0),))
    verify(IRModule({"f": PrimFunc((X, Y), body, {"kiln.num_outputs": 1})}))
    fails(IRModule({"f": PrimFunc((X, Y), body, {"kiln.num_outputs": 3})}),
          "attribute kiln.num_outputs=3 must be an int between 0 and the number of "
          "parameters (2)")
    fails(IRModule({"f": PrimFunc((X, Var("n")), body, {"kiln.num_outputs": 1})}),
          "makes scalar parameter 'n' an output")
    fails(IRModule({"f": PrimFunc((X, Y), body, {"kiln.num_outputs": 1,
                                                  "kiln.output_names": ("a", "b")})}),
          "kiln.output_names has 2 names but kiln.num_outputs is 1")


def test_symbolic_shapes() -> None:
    n = Var("n")
    A = Buffer("A", (n,), "float32")
    i = Var("i")
    verify(prim(For(i, const(0), n, "serial", Store(A, const(0.0, "float32"), (i,))), A))
    m = Var("m")
    B = Buffer("B", (m * 2,), "float32")
    fails(prim(Store(B, const(0.0, "float32"), (const(0),)), B), "undefined variable 'm'")


def test_verify_rejects_non_ir() -> None:
    with pytest.raises(IRError, match="verify expects an IRModule, PrimFunc or graph Function"):
        verify("nope")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- quoting


def quoted_lines(message: str) -> list[str]:
    """The quoted function lines of a verifier message, without numbers and markers."""
    return [line.split(" | ", 1)[1] for line in message.splitlines() if " | " in line]


def test_the_quote_is_the_dsl_text() -> None:
    from kiln.script import print_func

    i = Var("i")
    fn = PrimFunc((X, Y), loop(i, 4, Store(Y, t.Cast("float64", X[i]), (i,))))
    message = fails(IRModule({"f": fn}), "insert a Cast")
    dsl = print_func(fn, "f").splitlines()
    quoted = quoted_lines(message)
    assert quoted and all(line in dsl for line in quoted)
    assert quoted[-1] == '        Y[i] = T.cast(X[i], "float64")'


def test_the_quote_survives_attributes_no_literal_spells() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    i = Var("i")
    fn = PrimFunc((X, Y), loop(i, 4, Store(Y, t.Cast("float64", X[i]), (i,))),
                  {"target": Opaque()})
    message = fails(IRModule({"f": fn}), "insert a Cast")
    assert "    T.func_attr({'target': <opaque>})" in quoted_lines(message)
    assert '> 5 |         Y[i] = T.cast(X[i], "float64")' in message
