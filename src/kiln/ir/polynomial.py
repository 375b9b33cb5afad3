"""Polynomials with integer coefficients over opaque atoms, and their exact division.

The arithmetic under `kiln.ir.shape_expr`'s canonical sizes. An *atom* is any
comparable, hashable key (shape_expr uses `("var", name, id)` for a dimension
variable and a key of the canonical operands for a `min`, a `max` or a floor
division that does not divide out); a *monomial* is a sorted tuple of
`(atom, power)` pairs, `()` for the constant term; a *polynomial* a dict from
monomial to a non-zero int coefficient (`{}` is zero).

`divide(p, q)` is the division algorithm of multivariate polynomials for one
divisor, under the graded lexicographic order of the atoms: it returns the
quotient when `q` divides `p` (`p == quotient * q` as polynomials), else None. For
one divisor the remainder is zero exactly when `q` divides `p`, whatever the
monomial order, so None means "not a multiple" and never "not found". This is what
exporters rely on when they compute a size back from a product: `batch*seq //
batch` is `seq`, and `batch*12*(past + seq)*64` is `batch*12` times
`(past + seq)*64`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

Atom = tuple[Any, ...]
Mono = tuple[tuple[Atom, int], ...]      # sorted (atom, power) pairs
Poly = dict[Mono, int]                   # monomial -> coefficient (non-zero)

# A division whose quotient would have more terms than this is given up (None): sizes
# have a handful of terms, and the bound keeps a pathological input from running long.
MAX_QUOTIENT_TERMS = 4096


def accumulate(out: dict[Mono, Any], m: Mono, c: Any) -> None:
    """`out[m] += c`, dropping the term when it cancels (coefficients stay non-zero)."""
    v = out.get(m, 0) + c
    if v:
        out[m] = v
    else:
        out.pop(m, None)


def add(a: Poly, b: Poly, sign: int = 1) -> Poly:
    """`a + sign*b`."""
    out = dict(a)
    for m, c in b.items():
        accumulate(out, m, sign * c)
    return out


def mono_mul(x: Mono, y: Mono) -> Mono:
    """The product of two monomials."""
    powers: dict[Atom, int] = dict(x)
    for key, p in y:
        powers[key] = powers.get(key, 0) + p
    return tuple(sorted(powers.items()))


def mul(a: Poly, b: Poly) -> Poly:
    """`a * b`."""
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            accumulate(out, mono_mul(ma, mb), ca * cb)
    return out


def mono_div(x: Mono, y: Mono) -> Mono | None:
    """`x / y` when `y` divides `x` (every atom of `y` at most as often in `x`), else None."""
    powers = dict(x)
    for key, p in y:
        if powers.get(key, 0) < p:
            return None
        powers[key] -= p
        if not powers[key]:
            del powers[key]
    return tuple(sorted(powers.items()))


def degree(m: Mono) -> int:
    """The total degree of a monomial."""
    return sum(power for _, power in m)


def constant(p: Poly) -> int | None:
    """The value of `p` when it is a constant, else None."""
    if not p:
        return 0
    if len(p) == 1 and () in p:
        return p[()]
    return None


def _order(*polys: Poly) -> Any:
    """The graded lexicographic order over the atoms of `polys`, as a sort key of monomials:
    total degree first, then the powers of the atoms in their sorted order."""
    atoms = sorted({key for p in polys for m in p for key, _ in m})
    rank = {key: k for k, key in enumerate(atoms)}

    def key(m: Mono) -> tuple[int, tuple[int, ...]]:
        powers = [0] * len(atoms)
        for atom, power in m:
            powers[rank[atom]] = power
        return degree(m), tuple(powers)

    return key


def divide(p: Poly, q: Poly) -> Poly | None:
    """The quotient `p / q` when `q` divides `p` exactly with integer coefficients, else
    None (module docstring); `q == 0` gives None, `p == 0` gives 0.

    Runs over the rationals (the leading coefficient of `q` need not divide those of
    `p` on the way), then keeps the quotient only when its coefficients are integers:
    `(2*s + 2) / (s + 1)` is 2, `(s + 1) / (2*s + 2)` is no integer polynomial."""
    if not q:
        return None
    order = _order(p, q)
    lead = max(q, key=order)
    rest: dict[Mono, Fraction] = {m: Fraction(c) for m, c in p.items()}
    quotient: dict[Mono, Fraction] = {}
    while rest:
        top = max(rest, key=order)
        m = mono_div(top, lead)
        if m is None or len(quotient) >= MAX_QUOTIENT_TERMS:
            return None  # the leading term stays in the remainder: no multiple of q
        c = rest[top] / q[lead]
        accumulate(quotient, m, c)
        for mq, cq in q.items():
            accumulate(rest, mono_mul(m, mq), -c * cq)
    if any(c.denominator != 1 for c in quotient.values()):
        return None
    return {m: int(c) for m, c in quotient.items()}
