"""The attributes a packed op's call carries about its kernel: the register tile
(`tile`), read by its type rule (the verifier refuses a malformed one) and by the kernel
that builds it (kiln.kernels)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kiln.errors import IRError

#: The attribute a packed call records its register tile in.
TILE = "tile"


def recorded_tile(attrs: Mapping[str, Any], size: int, what: str) -> tuple[int, ...] | None:
    """The `tile` attribute of a call (None when absent), checked to hold `size`
    positive ints."""
    tile = attrs.get(TILE)
    if tile is None:
        return None
    if (not isinstance(tile, (tuple, list)) or len(tile) != size
            or not all(isinstance(t, int) and t > 0 for t in tile)):
        raise IRError(f"{what}: attribute 'tile' must be {size} positive ints, got {tile!r}")
    return tuple(tile)


def checking_tile(infer: Callable[[Any, Any], Any], op: str, size: int
                  ) -> Callable[[Any, Any], Any]:
    """The type rule `infer` of `op`, first checking the call's recorded tile (so the
    verifier refuses a malformed one)."""
    def checked(types: Any, attrs: Any) -> Any:
        recorded_tile(attrs, size, op)
        return infer(types, attrs)

    return checked
