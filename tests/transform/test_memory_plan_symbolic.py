"""plan_symbolic: intermediates of symbolic size laid out at offsets that are expressions,
never overlapping while live together, for every value of the variables."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from kiln.ir.shape_expr import dim_at_least, dim_var, eval_dim
from kiln.transform.memory_plan import plan_symbolic

B, S = dim_var("batch"), dim_var("seq")


def _blocks(rng: np.random.Generator, count: int) -> list[tuple[str, object, int, int]]:
    # bytes of float32 tensors: multiples of 4
    sizes = [B * S * 4, B * S * S * 8, B * S * 12, B * 28 + 12, S * S * 4, B * S * 4 * 3,
             B * 4, B * 64]
    out = []
    for k in range(count):
        start = int(rng.integers(0, 20))
        out.append((f"v{k}", sizes[int(rng.integers(0, len(sizes)))], start,
                    start + int(rng.integers(0, 6))))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_live_blocks_never_overlap_at_any_size(seed: int) -> None:
    rng = np.random.default_rng(seed)
    blocks = _blocks(rng, 14)
    offsets, total = plan_symbolic(blocks, 200)
    for batch, seq in itertools.product((0, 1, 3), (1, 2, 7, 100)):
        env = {"batch": batch, "seq": seq}
        spans = {k: (eval_dim(offsets[k], env), eval_dim(offsets[k], env) + eval_dim(size, env))
                 for k, size, _, _ in blocks}
        end = eval_dim(total, env)
        for k, _size, start, stop in blocks:
            lo, hi = spans[k]
            # after the static part, aligned to the elements at least
            assert lo >= 256 and lo % 4 == 0 and hi <= end, (k, env)
            for k2, _, start2, stop2 in blocks:
                live = start <= stop2 and start2 <= stop
                lo2, hi2 = spans[k2]
                assert k == k2 or not live or hi <= lo2 or hi2 <= lo or hi == lo or hi2 == lo2


def test_blocks_never_live_together_share_bytes() -> None:
    """A chain a -> b -> c of equal sizes needs two buffers' bytes, not three; sizes
    that are not multiples of one product (a sum) share slots."""
    for size in (B * S * 64, B * S * 64 + S * 64):
        offsets, total = plan_symbolic([("a", size, 0, 1), ("b", size, 1, 2),
                                        ("c", size, 2, 3)], 0)
        assert offsets["a"] == offsets["c"] != offsets["b"]
        assert eval_dim(total, {"batch": 2, "seq": 5}) == 2 * eval_dim(size, {"batch": 2,
                                                                             "seq": 5})


def test_sizes_of_one_product_get_the_static_plan_scaled() -> None:
    """Every size a multiple of `batch` (a CNN): the static plan of the multiples, times
    batch, so the workspace is what a static build at that batch would plan."""
    blocks = [("a", B * 256, 0, 1), ("b", B * 64, 1, 2), ("c", B * 64, 1, 3),
              ("d", B * 256, 3, 4)]
    _, total = plan_symbolic(blocks, 0)
    assert eval_dim(total, {"batch": 3}) == 3 * (256 + 64 + 64)  # a, b, c live at step 1


def test_dim_at_least_is_sound() -> None:
    assert dim_at_least(B * S * 8, B * S * 4)
    assert dim_at_least(B * S * S, B * S * S)
    assert not dim_at_least(B * S * 4, B * S * S)  # depends on seq
    assert not dim_at_least(B * 4, B * 4 + 1)


def test_a_workspace_size_too_long_for_the_metadata_is_written_unknown(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    # a deep network's symbolic workspace is a max over its buffers: MobileNetV2 with a
    # symbolic image size wrote a text its own loader refused (library_schema's
    # SIZE_TEXT_MAX); the writer now writes null for it (the limit lowered here, so a
    # small model reaches it)
    import subprocess
    import sys

    import kiln
    from kiln.frontend import from_onnx
    from kiln.transform import lower_graph
    from support.graphs import GraphBuilder

    gb = GraphBuilder(seed=1)
    y = gb.input("x", (1, 4, "h", "w"))
    for _ in range(4):
        y = gb.op("Conv", y, gb.weight(4, 4, 3, 3), kernel_shape=[3, 3], pads=[0, 1, 0, 0])
    gb.output(y, typed=False)
    model = gb.model(check=False)
    full = kiln.compile(from_onnx(model), "llvm").metadata["workspace_bytes"]["main"]
    assert isinstance(full, str) and "max(" in full
    monkeypatch.setattr(lower_graph, "SIZE_TEXT_MAX", len(full) - 1)
    ex = kiln.compile(from_onnx(model), "llvm")
    assert ex.metadata["workspace_bytes"].get("main") is None
    lib = tmp_path / "m.so"
    ex.export_library(lib)
    x = np.random.default_rng(0).standard_normal((1, 4, 12, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np, kiln.runtime as rt; m = rt.load_module(sys.argv[1]); "
            "np.save(sys.argv[3], m['main'](np.load(sys.argv[2])))")
    subprocess.run([sys.executable, "-c", code, str(lib), str(tmp_path / "x.npy"),
                    str(tmp_path / "y.npy")], check=True, timeout=120)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.asarray(ex["main"](x)))
