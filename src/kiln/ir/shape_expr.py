"""Symbolic tensor dimensions: canonical forms, equality, products and exact division.

A dimension (`kiln.ir.types.Dim`) is an `int` or an int64 `PrimExpr` over
dimension variables: `Var(name, "int64")`, one object per distinct name in a
function (`batch`, `seq`). Shape rules build expressions such as `seq * 4` or
`(h + 2 - 3) // 2 + 1`; this module brings them to one canonical form so that two
spellings of one size compare equal and print alike.

The canonical form is a polynomial with integer coefficients over *atoms*: a
dimension variable, or an expression that is not a polynomial (a floor division
or remainder that does not divide out, `min`, `max`, ...), itself canonical
inside. `simplify_dim` returns an `int` when the value is constant. A floor
division (or remainder) divides out when its divisor is a positive constant
dividing every coefficient, or a polynomial dividing the dividend exactly
(`kiln.ir.polynomial.divide`): `batch*seq // batch` is `seq`, `(p + s)*64 % (p + s)`
is 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kiln import dim_expr
from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import polynomial
from kiln.ir.attrs import ATTR_DIM_BOUNDS, ATTR_DIM_NONZERO, ATTR_GRAPH
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import BinaryOp, Cast, Const, PrimExpr, PrimFunc, UnaryOp, Var, as_expr
from kiln.ir.types import Dim

# An atom: a dimension variable, or a canonical non-polynomial expression.
_AtomKey = polynomial.Atom
_Poly = polynomial.Poly


def dim_var(name: str) -> Var:
    """A fresh dimension variable (int64)."""
    return Var(name, INDEX_DTYPE)


class _Canon:
    """Converts expressions to polynomials, remembering each atom's expression."""

    def __init__(self) -> None:
        self.atoms: dict[_AtomKey, PrimExpr] = {}

    # ------------------------------------------------------------------ to polynomial

    def poly(self, d: Dim) -> _Poly:
        """The polynomial of `d`, built bottom-up without recursion (a size may be a sum
        of hundreds of terms, or nest `max`es as deep)."""
        done: dict[int, _Poly] = {}
        stack: list[tuple[Any, bool]] = [(d, False)]
        while stack:
            e, expanded = stack.pop()
            if id(e) in done:
                continue
            operands = _operands(e)
            if operands and not expanded:
                stack.append((e, True))
                stack.extend((x, False) for x in operands if id(x) not in done)
                continue
            done[id(e)] = self._node(e, [done[id(x)] for x in operands])
        return done[id(d)]

    def _node(self, d: Any, operands: list[_Poly]) -> _Poly:
        """The polynomial of one node, given its operands' polynomials."""
        if isinstance(d, bool):
            raise IRError(f"bad dimension {d!r}")
        if isinstance(d, int):
            return {(): d} if d else {}
        if isinstance(d, Const):
            return self._node(int(d.value), [])
        if isinstance(d, Var):
            return self._atom(("var", d.name, id(d)), d)
        if isinstance(d, Cast) and dt.kind(d.value.dtype) in ("int", "uint"):
            return operands[0]
        if isinstance(d, BinaryOp):
            return self._binary(d, operands[0], operands[1])
        if isinstance(d, UnaryOp) and d.op == "neg":
            return {m: -c for m, c in operands[0].items()}
        raise IRError(f"unsupported dimension expression {d!r}")

    def _atom(self, key: _AtomKey, expr: PrimExpr) -> _Poly:
        self.atoms.setdefault(key, expr)
        return {((key, 1),): 1}

    def _binary(self, e: BinaryOp, a: _Poly, b: _Poly) -> _Poly:
        if e.op == "add":
            return polynomial.add(a, b, 1)
        if e.op == "sub":
            return polynomial.add(a, b, -1)
        if e.op == "mul":
            return polynomial.mul(a, b)
        ca, cb = polynomial.constant(a), polynomial.constant(b)
        if ca is not None and cb is not None:
            return self.poly(_fold(e.op, ca, cb))
        if e.op in ("floordiv", "floormod", "div", "mod") and cb is not None and cb > 0:
            if all(c % cb == 0 for c in a.values()):
                if e.op in ("floordiv", "div"):
                    return {m: c // cb for m, c in a.items()}
                return {}
            if cb == 1:
                return a if e.op in ("floordiv", "div") else {}
        if e.op in ("floordiv", "floormod", "div", "mod") and cb is None:
            # `b` divides `a` as polynomials (`batch*seq // batch`): the quotient is exact
            # wherever `b` is not 0 (where the division itself is an error), rounding
            # either way, and the remainder 0.
            q = polynomial.divide(a, b)
            if q is not None:
                return q if e.op in ("floordiv", "div") else {}
        if e.op in ("min", "max") and a == b:
            return a
        key = (e.op, _poly_key(a), _poly_key(b))
        return self._atom(key, BinaryOp(e.op, as_expr(self.expr(a)), as_expr(self.expr(b))))

    # ------------------------------------------------------------------ back to Dim

    def expr(self, p: _Poly) -> Dim:
        const = p.get((), 0)
        # positive terms first, so `seq - min(1, seq)` rather than `min(1, seq)*-1 + seq`
        terms = sorted((m for m in p if m), key=lambda m: (p[m] < 0, -polynomial.degree(m), m))
        out: PrimExpr | None = None
        for m in terms:
            coeff = p[m]
            term: PrimExpr | None = None
            for key, power in m:
                for _ in range(power):
                    atom = self.atoms[key]
                    term = atom if term is None else term * atom
            assert term is not None
            if out is None and coeff < 0 and const > 0:  # `3 - s`, not `s*-1 + 3`
                out, const = as_expr(const) - (term * -coeff if coeff != -1 else term), 0
            elif out is None and coeff < 0:
                out = -(term * -coeff if coeff != -1 else term)
            elif out is None:
                out = term * coeff if coeff != 1 else term
            elif coeff < 0:
                out = out - (term * -coeff if coeff != -1 else term)
            else:
                out = out + (term * coeff if coeff != 1 else term)
        if out is None:
            return const
        if const > 0:
            return out + const
        if const < 0:
            return out - (-const)
        return out


def _fold(op: str, a: int, b: int) -> int:
    if op in ("floordiv", "floormod") and b == 0:
        raise IRError(f"division by zero in a dimension ({op} {a}, {b})")
    if op in ("div", "mod") and b == 0:
        raise IRError(f"division by zero in a dimension ({op} {a}, {b})")
    table = {
        "floordiv": lambda: a // b, "floormod": lambda: a % b,
        "div": lambda: abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1),
        "mod": lambda: a - b * (abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)),
        "min": lambda: min(a, b), "max": lambda: max(a, b),
    }
    if op not in table:
        raise IRError(f"unsupported operator {op!r} in a dimension")
    return int(table[op]())


def _poly_key(p: _Poly) -> tuple[Any, ...]:
    return tuple(sorted(p.items()))


# ---------------------------------------------------------------------- public API


def simplify_dim(d: Dim) -> Dim:
    """The canonical form of `d`: an `int` when constant, else a canonical PrimExpr."""
    if type(d) is int:  # a static size, most of them (not a bool: _Canon rejects it)
        return d
    c = _Canon()
    return c.expr(c.poly(d))


def simplify_shape(shape: Iterable[Dim]) -> tuple[Dim, ...]:
    """`simplify_dim` of every dimension."""
    return tuple(simplify_dim(d) for d in shape)


def dims_equal(a: Dim, b: Dim) -> bool | None:
    """True if `a == b` for every value of the variables, False if never, None if it depends."""
    if type(a) is int and type(b) is int:
        return a == b
    c = _Canon()
    diff = polynomial.add(c.poly(a), c.poly(b), -1)
    k = polynomial.constant(diff)
    if k is None:
        return None
    return k == 0


def shapes_equal(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    """Whether two shapes are provably equal for every value of their variables (two
    symbolic dimensions are separately built expressions: compare them so, not with
    `==`)."""
    return len(a) == len(b) and all(
        x == y if isinstance(x, int) and isinstance(y, int) else dims_equal(x, y) is True
        for x, y in zip(a, b))


def dim_at_least(a: Dim, b: Dim) -> bool:
    """True if `a >= b` for every value of the variables, taking each variable to be
    non-negative (sizes are): `a - b` has no negative coefficient and only plain variables.
    False when that cannot be shown (not: when it is false)."""
    c = _Canon()
    diff = polynomial.add(c.poly(a), c.poly(b), -1)
    return all(coeff >= 0 and all(key[0] == "var" for key, _ in m)
               for m, coeff in diff.items())


def equated_variables(a: Dim, b: Dim) -> tuple[str, str] | None:
    """`(x, y)` when `a == b` holds exactly when the variables `x` and `y` are equal
    (`a - b` is `x - y`: `s20 + s41` against `s41 + s8`), else None; the names sorted."""
    c = _Canon()
    diff = polynomial.add(c.poly(a), c.poly(b), -1)
    if len(diff) != 2 or sorted(diff.values()) != [-1, 1]:
        return None
    names: list[str] = []
    for mono in diff:
        if len(mono) != 1 or mono[0][1] != 1 or mono[0][0][0] != "var":
            return None
        names.append(str(mono[0][0][1]))
    x, y = sorted(names)
    return (x, y) if x != y else None


def monomial(d: Dim) -> tuple[int, Dim] | None:
    """`(c, m)` when `d` is `c * m` for a positive int `c` and a product `m` of
    variables (`batch*seq*256` -> `(256, batch*seq)`), else None (a constant, a sum)."""
    c = _Canon()
    p = c.poly(d)
    if len(p) != 1:
        return None
    ((mono, coeff),) = p.items()
    if not mono or coeff <= 0 or any(key[0] != "var" for key, _ in mono):
        return None
    return coeff, c.expr({mono: 1})


def dim_terms(d: Dim) -> tuple[Dim, ...] | None:
    """The terms of `d` as a sum with positive coefficients, each term repeated as often
    as its coefficient and the constant last (`past_seq + seq*2 + 1` ->
    `(past_seq, seq, seq, 1)`), or None when some coefficient (or the constant) is
    negative. A dimension that is no sum is its one term."""
    c = _Canon()
    p = c.poly(d)
    if any(coeff < 0 for coeff in p.values()):
        return None
    terms: list[Dim] = []
    for mono, coeff in sorted(p.items(), key=lambda mc: not mc[0]):  # stable
        if not mono:
            terms.append(coeff)
        else:
            terms.extend([c.expr({mono: 1})] * coeff)
    return tuple(terms)


def is_static(d: Dim | Sequence[Dim]) -> bool:
    """Whether a dimension (or every dimension of a shape) is a plain int."""
    if type(d) is int:
        return True
    if isinstance(d, (int, PrimExpr)):
        return isinstance(simplify_dim(d), int)
    return all(is_static(x) for x in d)


def dim_product(dims: Iterable[Dim]) -> Dim:
    """The product of `dims` (1 for none), canonical."""
    c = _Canon()
    p: _Poly = {(): 1}
    for d in dims:
        p = polynomial.mul(p, c.poly(d))
    return c.expr(p)


def exact_div(a: Dim, b: Dim) -> Dim | None:
    """`a / b` when `b` divides `a` for every value of the variables (as polynomials with
    integer coefficients), else None: `batch*seq*768 / (seq*12)` = `batch*64`,
    `batch*(past + seq)*768 / ((past + seq)*64)` = `batch*12`; `b == 0` gives None.
    None means that `a` is not such a multiple (`kiln.ir.polynomial.divide`)."""
    c = _Canon()
    q = polynomial.divide(c.poly(a), c.poly(b))
    return None if q is None else c.expr(q)


def dim_vars(x: Dim | Iterable[Dim]) -> tuple[Var, ...]:
    """The dimension variables `x` mentions (a dim or a shape), unique, sorted by name."""
    found: dict[int, Var] = {}
    seen: set[int] = set()
    stack: list[Any] = [x] if isinstance(x, (int, PrimExpr)) else list(x)
    while stack:  # iterative, as every walk over a size
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, Var):
            found.setdefault(id(e), e)
        stack.extend(_operands(e))
    return tuple(sorted(found.values(), key=lambda v: v.name))


_TO_AST = {"add": dim_expr.Op.ADD, "sub": dim_expr.Op.SUB, "mul": dim_expr.Op.MUL,
           "floordiv": dim_expr.Op.FLOORDIV, "floormod": dim_expr.Op.FLOORMOD,
           "min": dim_expr.Op.MIN, "max": dim_expr.Op.MAX}


def _operands(e: Any) -> tuple[Any, ...]:
    if isinstance(e, BinaryOp):
        return (e.a, e.b)
    if isinstance(e, UnaryOp | Cast):
        return (e.a if isinstance(e, UnaryOp) else e.value,)
    return ()


def to_dim_expr(d: Dim) -> dim_expr.Expr:
    """`d` in the dimension-expression language (`kiln.dim_expr`), as written (not
    canonicalised): integer casts are dropped; an operator outside the language
    (truncating `div`/`mod`, `pow`, ...) or a constant outside int64 is an IRError."""
    done: dict[int, dim_expr.Expr] = {}
    stack: list[tuple[Any, bool]] = [(d, False)]
    while stack:  # iterative: a workspace size may be a sum of hundreds of terms
        e, expanded = stack.pop()
        if id(e) in done:
            continue
        if not expanded:
            stack.append((e, True))
            stack.extend((c, False) for c in _operands(e) if id(c) not in done)
            continue
        done[id(e)] = _to_node(e, done)
    return done[id(d)]


def _to_node(e: Any, done: Mapping[int, dim_expr.Expr]) -> dim_expr.Expr:
    """One node of `to_dim_expr`, its operands already converted."""
    if isinstance(e, bool):
        raise IRError(f"bad dimension {e!r}")
    if isinstance(e, int | Const) and (isinstance(e, int) or dt.kind(e.dtype) in ("int", "uint")):
        value = int(e if isinstance(e, int) else e.value)
        if not dim_expr.INT64_MIN <= value <= dim_expr.INT64_MAX:
            raise IRError(f"dimension constant {value} does not fit int64")
        return dim_expr.Const(value)
    if isinstance(e, Var):
        return dim_expr.Var(e.name)
    if isinstance(e, Cast) and dt.kind(e.value.dtype) in ("int", "uint"):
        return done[id(e.value)]
    if isinstance(e, UnaryOp) and e.op == "neg":
        return dim_expr.Neg(done[id(e.a)])
    if isinstance(e, BinaryOp) and e.op in _TO_AST:
        return dim_expr.Binary(_TO_AST[e.op], done[id(e.a)], done[id(e.b)])
    raise IRError(f"unsupported dimension expression {e!r}")


def from_dim_expr(e: dim_expr.Expr, variables: Mapping[str, Dim] | None = None) -> Dim:
    """The canonical Dim of `e`; each variable is `variables[name]` (a fresh `dim_var`
    when not given, one per name; a size where the mapping gives one)."""
    found: dict[str, Dim] = dict(variables or {})

    def leaf(n: dim_expr.Const | dim_expr.Var) -> Dim:
        if isinstance(n, dim_expr.Const):
            return n.value
        return found.setdefault(n.name, dim_var(n.name))

    def node(n: dim_expr.Neg | dim_expr.Binary, args: list[object]) -> PrimExpr:
        exprs = [as_expr(a, INDEX_DTYPE) for a in args]  # type: ignore[arg-type]
        if isinstance(n, dim_expr.Neg):
            return -exprs[0]
        return BinaryOp(n.op.value, exprs[0], exprs[1])

    out = dim_expr.fold(e, leaf, node)
    assert isinstance(out, int | PrimExpr)
    return simplify_dim(out)


def substitute(d: Dim, values: Mapping[str, int]) -> Dim:
    """`d` with the variables named in `values` replaced by those sizes, canonical (the
    size a pin would give)."""
    variables: dict[str, Any] = {v.name: v for v in dim_vars(d)}
    variables.update(values)
    return from_dim_expr(to_dim_expr(d), variables)


def eval_dim(d: Dim, values: Mapping[str, int]) -> int:
    """The value of `d` with each variable given by name in `values`, computed as
    `kiln.dim_expr.evaluate` does (int64, checked): a missing variable, an overflow or
    a zero divisor is a CallError naming the dimension."""
    return dim_expr.evaluate(to_dim_expr(d), values)


def dim_text(d: Dim) -> str:
    """`d` as Python-like text: `seq*4`, `batch*seq`, `(h - 1)//2 + 1`, `64` (the text
    form of `kiln.dim_expr`, of the canonical form)."""
    return dim_expr.to_text(to_dim_expr(simplify_dim(d)))


def shape_text(shape: Iterable[Dim]) -> str:
    """`[batch, seq, 64]`."""
    return "[" + ", ".join(dim_text(d) for d in shape) + "]"


def graph_dims(fn: PrimFunc) -> tuple[Var, ...]:
    """The dimension scalars a lowered graph function takes last, which its packed entry
    reads from the tensors instead of taking them (docs/dynamic-shapes.md)."""
    if not fn.attrs.get(ATTR_GRAPH):
        return ()
    tail: list[Var] = []
    for q in reversed(fn.params):
        if not isinstance(q, Var):
            break
        tail.append(q)
    return tuple(reversed(tail))


def dim_bounds(fn: PrimFunc) -> dict[str, tuple[int, int | None]]:
    """`{variable: (min, max)}` of `kiln.dim_bounds` (a variable it does not list is a size:
    min 0, no max)."""
    bounds: dict[str, tuple[int, int | None]] = {}
    for entry in fn.attrs.get(ATTR_DIM_BOUNDS, ()) or ():
        name, low, high = entry
        bounds[str(name)] = (int(low), None if high is None else int(high))
    return bounds


def dim_nonzero(fn: PrimFunc) -> tuple[tuple[str, str], ...]:
    """`(text, why)` of every size `fn` needs to be non-zero at call time
    (`kiln.dim_nonzero`: a Reshape's -1 divides by it)."""
    return tuple((str(text), str(why)) for text, why in fn.attrs.get(ATTR_DIM_NONZERO, ()) or ())
