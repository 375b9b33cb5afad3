"""kiln.transform: IRModule -> IRModule passes, pass context, instruments, pipelines.

    from kiln.transform import PassContext, Sequential, TimingInstrument, get_pipeline
    timing = TimingInstrument()
    with PassContext(instruments=[timing]):
        lowered = get_pipeline("default", "graph")(mod)
    print(timing.report())

See docs/passes.md.
"""

from kiln.ir.attrs import ATTR_PRIVATE, ATTR_WORKSPACE_BYTES
from kiln.transform.context import PassContext
from kiln.transform.dead_code import DeadCodeElimination
from kiln.transform.instruments import (
    DumpIRInstrument,
    PassInstrument,
    PassTiming,
    TimingInstrument,
)
from kiln.transform.legalize_ops import LegalizeOps
from kiln.transform.lower_graph import LowerGraphToTensor
from kiln.transform.memory_plan import Block, MemoryPlan, plan_memory
from kiln.transform.pass_base import FunctionPass, Pass, Sequential, function_pass
from kiln.transform.pipeline import get_pipeline, list_pipelines, register_pipeline
from kiln.transform.registry import get_pass, list_passes, parse_passes, register_pass
from kiln.transform.simplify import Simplify

__all__ = [
    "ATTR_PRIVATE",
    "ATTR_WORKSPACE_BYTES",
    "Block",
    "DeadCodeElimination",
    "DumpIRInstrument",
    "FunctionPass",
    "LegalizeOps",
    "LowerGraphToTensor",
    "MemoryPlan",
    "Pass",
    "PassContext",
    "PassInstrument",
    "PassTiming",
    "Sequential",
    "Simplify",
    "TimingInstrument",
    "function_pass",
    "get_pass",
    "get_pipeline",
    "list_passes",
    "list_pipelines",
    "parse_passes",
    "plan_memory",
    "register_pass",
    "register_pipeline",
]
