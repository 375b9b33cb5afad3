"""Kernel replay: every function the model set lowers to, per ISA, against its golden.

A refactor of the kernel templates, the passes or the frontend that changes no
generated kernel passes; any change to one (an instruction, a tile, a packed weight
byte) fails here and names the functions it changed. A change meant to move kernels
regenerates tests/replay/goldens.json (make_goldens.py) in the same commit.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from replay_models import GOLDENS, MODELS, TARGETS, digests

GOLDEN = json.loads(GOLDENS.read_text())


def changes(model: str, isa: str) -> list[str]:
    """What differs between `model`'s lowered functions for `isa` and the golden ones."""
    want = GOLDEN[model][isa]
    got = digests(MODELS[model](), TARGETS[isa])
    out = [f"{name}: {'not generated' if name not in got else 'changed'}"
           for name in want if got.get(name) != want[name]]
    out += [f"{name}: new" for name in got if name not in want]
    return out


def test_goldens_cover_the_set() -> None:
    assert sorted(GOLDEN) == sorted(MODELS)
    assert all(sorted(per_isa) == sorted(TARGETS) for per_isa in GOLDEN.values())


@pytest.mark.parametrize("isa", sorted(TARGETS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_generated_kernels_match_goldens(model: str, isa: str) -> None:
    changed = changes(model, isa)
    assert not changed, (
        f"{model} on {isa} ({TARGETS[isa]}) lowers differently from "
        f"tests/replay/goldens.json: {'; '.join(changed[:8])}"
        f"{f' and {len(changed) - 8} more' if len(changed) > 8 else ''}. If the change "
        "is meant, run tests/replay/make_goldens.py and say why in the commit")


def test_replay_fails_on_one_changed_instruction(monkeypatch: pytest.MonkeyPatch) -> None:
    """The multiply-add of the register-tile templates written unfused (a multiply and
    an add in place of one FMA) must show in the convolutions' digests."""
    from kiln.kernels import tiles

    assert not changes("resnet18", "avx2")  # imports every template module it uses
    fused_madd = tiles.madd

    def unfused(acc: Any, a: Any, b: Any, fused: bool = True) -> Any:
        return fused_madd(acc, a, b, fused=False)

    patched = 0
    for name, module in list(sys.modules.items()):
        if name.startswith("kiln.") and getattr(module, "madd", None) is fused_madd:
            monkeypatch.setattr(module, "madd", unfused)
            patched += 1
    assert patched >= 2
    changed = changes("resnet18", "avx2")
    assert any("conv2d" in c and c.endswith("changed") for c in changed), changed
