"""Bad DSL text raises ScriptError (an IRError) naming the line and column, with a caret."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from kiln.errors import IRError
from kiln.script import ScriptError, from_source

HEADER = '''
@T.prim_func
def f(X: T.Buffer((4,), "float32"), Y: T.Buffer((4,), "float32"), K: T.Buffer((4,), "int32")):
    for i in T.serial(4):
'''


def body_error(line: str) -> ScriptError:
    """Parse HEADER + one loop-body line (text line 5) and return the error."""
    with pytest.raises(ScriptError) as info:
        from_source(HEADER + "        " + line + "\n")
    return info.value


def test_unknown_intrinsic_reports_line_column_and_suggestion() -> None:
    err = body_error("Y[i] = T.expp(X[i])")
    assert str(err) == (
        "line 5, col 16: unknown intrinsic 'expp'; did you mean 'exp'?\n"
        "            Y[i] = T.expp(X[i])\n"
        "                   ^^^^^^"
    )
    assert (err.line, err.col) == (5, 16)
    assert isinstance(err, IRError)


def test_syntax_error_is_located() -> None:
    with pytest.raises(ScriptError, match=r"line 3, col \d+: invalid syntax"):
        from_source("@T.prim_func\ndef f():\n    for i in T.serial(4)\n        pass\n")


@pytest.mark.parametrize(("line", "col", "message"), [
    ("Y[i] = X[i] + Z[i]", 23, "unknown name 'Z'"),
    ("Y[i] = X[ii]", 18, "unknown name 'ii'; did you mean 'i'?"),
    ("Y[i] = X[i] + K[i]", 16, "add: operand dtypes differ (float32 vs int32); insert a Cast"),
    ("K[i] = K[i] / K[i]", 16, "'/' on int32 operands: use '//' (floor division) or "
                               "T.truncdiv(a, b) (C division)"),
    ("Y[i] = T.truncdiv(X[i], X[i])", 16, "T.truncdiv needs integer operands; for floats use '/'"),
    ("Y[i] = T.cast(X[i], \"float23\")", 29, "unknown dtype 'float23'; did you mean 'float32'?"),
    ("Y[i] = T.float32(X[i])", 16, "T.float32(...) takes a number; to convert an expression "
                                   "use T.cast(X[i], \"float32\")"),
    ("Y[i] = T.int32(1.5)", 24, "T.int32 takes an int, got 1.5"),
    ("Y[i] = T.float32(\"big\")", 26, "only \"inf\", \"-inf\" or \"nan\""),
    ("x = X[i]", 9, "cannot assign to 'x': store into a buffer"),
    ("Y[i] = X[1.5]", 18, "an index must be an integer, got 1.5"),
    ("Y[i] = X[0:2]", 18, "slices are not supported"),
    ("Y[i] = X", 16, "buffer 'X' used as a value"),
    ("K[i] = 1.5", 16, "cannot store the float literal 1.5 into int32 buffer 'K'"),
    ("Y[i] = T.select(0 < i < 3, X[i], Y[i])", 25, "chained comparisons are not supported"),
    ("Y[i] = X[i] if i < 2 else Y[i]", 16, "use T.select(cond, a, b)"),
    ("Y[i] = T.call_extern(\"expf\", X[i])", 16, "T.call_extern needs dtype="),
    ("Y[i] = T.serial(4)", 16, "T.serial is not an expression; it is a loop iterator"),
    ("Y[i] = G.const(1.0, \"float32\")", 16, "G.const is not tensor-level"),
    ("Y[i] = print(X[i])", 16, "unknown function `print`"),
    ("T.exp(X[i])", 9, "an expression statement must be T.evaluate(...)"),
    ("return", 9, "a @T.prim_func returns nothing"),
    ("assert i < 2", 9, "unsupported statement `assert`"),
    ("with T.let(\"x\", X[i]) as x: pass", 14, "T.let takes the value only"),
    ("with T.alloc(4) as x: pass", 14, "expected `with T.let/T.allocate"),
    ("with T.allocate((4,), \"float32\", scope=\"shared\") as x: pass", 48,
     "unknown buffer scope 'shared'"),
    ("with T.allocate((4,), \"float32\", scop=\"local\") as x: pass", 42,
     "T.allocate has no argument 'scop'; did you mean 'scope'?"),
    ("with T.alloc_const([1, 2.5], \"int32\") as c: pass", 28,
     "array element 2.5 does not fit dtype int32"),
    ("with T.alloc_const([300], \"uint8\") as c: pass", 28, "bad uint8 array data"),
    ("with T.alloc_const([1e300], \"float32\") as c: pass", 28, "out of range for float32"),
    ("with T.alloc_const([[1], [2, 3]], \"int32\") as c: pass", 28, "bad int32 array data"),
    ("with T.alloc_const(meta[\"w\"]) as c: pass", 28, "meta['w'] is not in the metadata"),
    ("c = T.alloc_const([300], \"uint8\")", 27, "bad uint8 array data"),
    ("x = T.allocate((4,), \"float32\", scope=\"shared\")", 47,
     "unknown buffer scope 'shared'"),
    ("X[0] = T.allocate((4,), \"float32\")", 9,
     "T.allocate(...) declares a buffer: assign it to a single name"),
    ("v = T.decl_buffer((1,), \"float32\", byte_offset=0)", 13,
     "T.decl_buffer needs source=<buffer>"),
    ("T.func_attr({\"a\": 1})", 9, "T.func_attr belongs at the top level"),
    ("Y[i] = T.exp(X[i], X[i])", 16, "T.exp takes 1 argument(s), got 2"),
    ("for j in T.serial(1, 2, 3): pass", 18, "a loop takes (stop), (start, stop)"),
    ("for j in T.spiral(4): pass", 18, "loop over T.serial/T.parallel"),
    ("Y[i] = T.max(X[i], 0.0, 1.0)", 16, "T.max takes 2 argument(s), got 3"),
    ("T.call_func(\"g\", X)", 26, "the arguments of T.call_func are a list"),
])
def test_body_errors(line: str, col: int, message: str) -> None:
    err = body_error(line)
    assert err.line == 5
    assert err.col == col, str(err)
    assert message in err.detail, str(err)
    assert "^" in str(err).splitlines()[-1]


def _parse(text: str, **kwargs: object) -> ScriptError:
    with pytest.raises(ScriptError) as info:
        from_source(textwrap.dedent(text), **kwargs)  # type: ignore[arg-type]
    return info.value


def test_structure_errors() -> None:
    assert "needs a @T.prim_func" in _parse("def f(): pass\n").detail
    assert "expected the @ir_module decorator" in _parse("class M:\n    pass\n").detail
    assert "defines no @ir_module class" in str(_parse("import numpy\n"))
    assert "unknown decorator" in _parse("@T.prim_fun\ndef f(): pass\n").detail
    err = _parse("@ir_module\nclass M:\n    x = 1\n")
    assert err.line == 3 and "holds @T.prim_func" in err.detail
    err = _parse("""
        @T.prim_func
        def f(X: T.Buffer((4,), "float32")):
            pass

        @T.prim_func
        def f(X: T.Buffer((4,), "float32")):
            pass
    """)
    assert err.line == 7 and "function 'f' is defined twice" in err.detail
    err = _parse("@T.prim_func\ndef f(X: T.Buffer((4,), 'float32'), X: T.int64):\n    pass\n")
    assert "duplicate parameter 'X'" in err.detail
    err = _parse("@T.prim_func\ndef f(X):\n    pass\n")
    assert "parameter 'X' needs an annotation" in err.detail
    err = _parse("@T.prim_func\ndef f(X: T.Buffer((4,), 'float32')):\n    '''doc'''\n")
    assert "empty body" in err.detail
    err = _parse("@T.prim_func\ndef _f():\n    pass\n")
    assert "must be a C identifier not starting with '_'" in err.detail
    err = _parse("@T.prim_func\ndef f(n: T.int65):\n    pass\n")
    assert "expected T.Buffer(shape, dtype) or a scalar type" in err.detail


def test_graph_errors() -> None:
    head = '@G.function\ndef main(x: G.Tensor((4,), "float32")) -> G.Tensor((4,), "float32"):\n'
    cases = {
        "    return G.op('relu', x)\n": "needs ret=<type> here",
        "    y: G.Tensor((4,), 'float32') = G.call_tensor('f', [x], G.Tensor((5,), 'float32'))"
        "\n    return y\n": "does not match its value's type",
        "    return (x, x)\n": "the return annotation",
        "    y = 1.0\n    return y\n": "a number is not a graph value",
        "    y: G.Tensor((4,), 'float32') = T.exp(x)\n    return y\n": "T.exp is not a graph-level",
        "    y: G.Tensor((4,), 'float32') = G.opp('relu', x)\n    return y\n":
            "unknown graph call 'G.opp'; did you mean 'op'?",
        "    y: G.Tensor((4,), 'float32') = G.op('relu', x)\n": "has no `return`",
        "    return x\n    return x\n": "statement after `return`",
        "    for i in range(3): pass\n    return x\n": "a @G.function body holds bindings",
        "    y: G.Tensor((4,), 'float32') = G.op('relu', x, ret=G.Tensor((4,), 'float32'), "
        "attrs={'ret': 1}, ret2=(1, [2]))\n    return y\n": "",
        "    y: G.Tensor((4,), 'float32') = G.op('relu', x, a=1, attrs={'a': 2})\n"
        "    return y\n": "attribute 'a' is given twice",
        "    y: G.Tensor((4,), 'float32') = G.op('relu', x, a=x)\n    return y\n":
            "expected an attribute value, not 'x' (a Var)",
        "    y: G.Tensor((4,), 'float32') = G.const([1, 2], 'float32', shape=(3,))\n"
        "    return y\n": "cannot reshape 2 elements to (3,)",
        "    y: G.Tensor((4,), 'float32') = G.const([1.0, 2.0, 3.0, 4.0])\n    return y\n":
            "with literal data needs a dtype",
        "    y: G.Tuple(G.Tensor((4,), 'float32')) = (x,)\n    z: G.Tensor((4,), 'float32') = "
        "y[1]\n    return z\n": "TupleGetItem index 1 does not fit",
    }
    for body, message in cases.items():
        if not message:
            from_source(head + body)  # lists in attrs are fine (frozen to tuples)
            continue
        try:
            err = _parse(head + body)
        except BaseException as exc:
            raise AssertionError(body) from exc
        assert message in err.detail, (body, str(err))
        assert err.line >= 2


def test_metadata_errors() -> None:
    text = "@G.function\ndef main() -> G.Tensor((2,), 'float32'):\n    return G.const(meta['w'])\n"
    assert "known: v" in _parse(text, metadata={"v": np.zeros(2, np.float32)}).detail
    good = {"w": np.zeros(2, np.float32)}
    from_source(text, metadata=good)
    err = _parse(text + "meta = {'w': {'dtype': 'float32', 'shape': (2,), 'base64': 'AAAA'}}\n")
    assert "3 bytes of data for shape (2,) float32 (expected 8)" in err.detail
    err = _parse(text + "meta = {'w': {'dtype': 'float32', 'shape': (2,)}}\n")
    assert "must be a dict with keys" in err.detail
    err = _parse(text + "meta = {'w': {'dtype': 'float32', 'shape': (0,), 'base64': ''}}\n",
                 metadata=good)
    assert "both in the text and in the metadata argument" in err.detail
    err = _parse(text + "meta = dict()\n")
    assert "must be a literal dict" in err.detail
    err = _parse(text.replace("meta['w']", "meta['w'], 'int32'"), metadata=good)
    assert "is float32, not int32" in err.detail
    with pytest.raises(IRError, match="cannot read metadata file"):
        from_source(text, metadata="/nonexistent/consts.npz")
    with pytest.raises(IRError, match="metadata must be a dict"):
        from_source(text, metadata=[1, 2])  # type: ignore[arg-type]
