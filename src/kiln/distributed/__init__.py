"""Work that outgrows one process: batch builds of many models for many targets, and
per-model tuning (kiln.distributed.tune: build tasks anywhere, measurement tasks on
nodes with the target's CPU; kiln.distributed.model_tuning: what is measured in the
whole model, in the driver).

`build_many(matrix, out_dir)` compiles every (model, target) cell of a build
matrix (kiln.distributed.matrix) as one task each; the tasks run on a Ray cluster
when Ray is installed (`pip install 'kiln-tensor[distributed]'`), else one after
another in this process, with the same results (kiln.distributed.executor).
Models travel to the workers through Ray's object store and libraries come back
the same way, so the nodes share no filesystem; a shared `cache_dir` lets them
share the compile cache too. docs/distributed.md tells the whole story.
"""

from kiln.distributed.build import CellResult, build_many, summary_table
from kiln.distributed.executor import Executor, InProcessExecutor, RayExecutor, make_executor
from kiln.distributed.matrix import BuildMatrix, load_matrix

__all__ = ["BuildMatrix", "CellResult", "Executor", "InProcessExecutor", "RayExecutor",
           "build_many", "load_matrix", "make_executor", "summary_table"]
