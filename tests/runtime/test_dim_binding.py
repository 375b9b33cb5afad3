"""bind_dims: dimension variables read from input shapes, checked with the docs/abi.md texts."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import CallError
from kiln.runtime.dim_binding import bind_dims, eval_dim_text, is_dim_text

PARAMS = [("ids", ("batch", "seq")), ("mask", ("batch", "seq")), ("w", (64,))]
BOUNDS = {"batch": (1, None), "seq": (1, 512)}


def _shapes(*arrays: np.ndarray) -> list[tuple[int, ...]]:
    return [a.shape for a in arrays]


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (3, 7), (2, 512)])
def test_binds_each_variable_from_the_first_input(batch: int, seq: int) -> None:
    ids = np.zeros((batch, seq), np.int64)
    mask = np.ones((batch, seq), np.float32)
    got = bind_dims("main", PARAMS, _shapes(ids, mask, np.zeros(64)), BOUNDS)
    assert got == {"batch": batch, "seq": seq}


def test_a_variable_with_two_sizes_names_both_arguments() -> None:
    shapes = _shapes(np.zeros((2, 7)), np.zeros((2, 9)), np.zeros(64))
    with pytest.raises(CallError) as err:
        bind_dims("main", PARAMS, shapes, BOUNDS)
    assert str(err.value) == (
        "main: dimension 'seq' is 7 in argument 0 'ids' but 9 in argument 1 'mask'"
    )


@pytest.mark.parametrize(
    ("seq", "text"),
    [
        (0, "main: dimension 'seq' = 0 is below its minimum 1"),
        (513, "main: dimension 'seq' = 513 is above its maximum 512"),
    ],
)
def test_bounds(seq: int, text: str) -> None:
    shapes = _shapes(np.zeros((1, seq)), np.zeros((1, seq)), np.zeros(64))
    with pytest.raises(CallError) as err:
        bind_dims("main", PARAMS, shapes, BOUNDS)
    assert str(err.value) == text


def test_static_dimension_and_rank_mismatch() -> None:
    with pytest.raises(CallError, match=r"argument 2 'w': expected shape \[64\], got \[63\]"):
        bind_dims("main", PARAMS, [(1, 2), (1, 2), (63,)], BOUNDS)
    with pytest.raises(CallError, match="argument 0 'ids': expected 2 dimensions, got 1"):
        bind_dims("main", PARAMS, [(2,), (1, 2), (64,)], BOUNDS)
    with pytest.raises(CallError, match="main: expected 3 arguments, got 2"):
        bind_dims("main", PARAMS, [(1, 2), (1, 2)], BOUNDS)


def test_a_bounded_variable_no_input_names_is_an_error() -> None:
    with pytest.raises(CallError, match="main: dimension 'seq' appears in no input"):
        bind_dims("main", [("x", ("batch",))], [(2,)], BOUNDS)


def test_a_static_mismatch_prints_the_variables_by_name() -> None:
    with pytest.raises(CallError) as err:
        bind_dims("main", [("x", ("batch", 4))], [(2, 5)], {"batch": (1, None)})
    assert str(err.value) == "main: argument 0 'x': expected shape [batch, 4], got [2, 5]"


@pytest.mark.parametrize("build", [
    lambda b, s: s * 4,
    lambda b, s: b * s + 3,
    lambda b, s: (s - 1) // 2 + 1,
    lambda b, s: (b * s) % 5 - s,
])
@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (3, 7), (2, 200)])
def test_dim_text_evaluates_as_the_compiler_does(build, batch: int, seq: int) -> None:
    from kiln.ir.shape_expr import dim_text, dim_var, eval_dim, simplify_dim

    dim = simplify_dim(build(dim_var("batch"), dim_var("seq")))
    values = {"batch": batch, "seq": seq}
    assert eval_dim_text(dim_text(dim), values) == eval_dim(dim, values)


@pytest.mark.parametrize(
    "text", ["__import__('os')", "seq.real", "seq ** 2", "[seq]", "1.5", "seq +", "seq // 0"]
)
def test_dim_text_outside_the_form_is_refused(text: str) -> None:
    with pytest.raises(CallError):
        eval_dim_text(text, {"seq": 3})


def test_dim_text_names_a_missing_variable() -> None:
    with pytest.raises(CallError, match="no value for 'seq'"):
        eval_dim_text("seq*2", {"batch": 1})


def test_an_expression_dimension_is_checked_after_binding() -> None:
    params = [("x", ("batch", "seq")), ("pairs", ("batch", "seq*2"))]
    assert bind_dims("main", params, [(2, 7), (2, 14)], BOUNDS) == {"batch": 2, "seq": 7}
    with pytest.raises(CallError) as err:
        bind_dims("main", params, [(2, 7), (2, 13)], BOUNDS)
    assert str(err.value) == (
        "main: argument 1 'pairs': expected shape [batch, seq*2], got [2, 13]"
    )


@pytest.mark.parametrize("text", ["seq", "seq*4", "(h - 1)//2 + 1", "max(seq, 2) % 3", "-b"])
def test_dimension_texts_of_the_compiler_are_accepted(text: str) -> None:
    assert is_dim_text(text)


@pytest.mark.parametrize("text", ["__import__('os').system('x')", "seq.real", "seq if 1 else 2",
                                  "[seq]", "1.5", "min(seq)", "lambda: 1", "x" * 2000, "(" * 300])
def test_hostile_dimension_texts_are_refused_unevaluated(text: str) -> None:
    assert not is_dim_text(text)
    with pytest.raises(CallError):
        eval_dim_text(text, {"seq": 1, "x": 1})


@pytest.mark.parametrize(("shape", "text"), [
    ((2, 1 << 62), "main: dimension 'seq*4' overflows int64"),
    ((2, -3), "main: dimension 'seq*4' = -12 is negative"),
])
def test_an_expression_dimension_that_is_no_size_is_named(shape, text: str) -> None:
    """The texts of kiln_host.c's dim_ok: a size that overflows or is negative is refused
    before it is compared, never wrapped."""
    params = [("x", ("batch", "seq")), ("wide", ("batch", "seq*4"))]
    with pytest.raises(CallError) as err:
        bind_dims("main", params, [shape, (2, 8)], {"batch": (1, None)})
    assert str(err.value) == text


def test_a_zero_divisor_is_named() -> None:
    with pytest.raises(CallError, match="dimension 'seq//0' divides by zero"):
        eval_dim_text("seq//0", {"seq": 3})
