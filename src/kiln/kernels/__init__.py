"""kiln.kernels: the hand-built CPU kernels, between the ops (what an operator means)
and the passes (which choose and place kernels).

An operator's meaning lives in kiln.ops (`OpDef`: type rule, tensor-expression compute,
numpy reference); its target-tuned kernel lives here, registered by the operator's
name in `LOWERINGS` (kiln.kernels.lowering): `lowering_for(op)` is the one door through
which legalization and fusion (kiln.transform) ask for a hand-built kernel, always with
the target's ISA as an argument. An op without a lowering gets its tensor-expression
definition on every target.
"""

from kiln.kernels.lowering import LOWERINGS, Lowering, legalize_call, lowering_for

__all__ = ["LOWERINGS", "Lowering", "legalize_call", "lowering_for"]
