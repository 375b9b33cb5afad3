"""Read-only analyses of the IR, shared by passes and backends.

- `loop_dependence`: may a loop's iterations run in parallel (Storage,
  loop_is_parallelizable);
- `tensor_queries`: what tensor-level IR references, reads, allocates, calls;
- `vector_loops`: which lane loops are straight-line vector code (the
  vectorize-loops pass and both CPU backends);
- `graph_uses`: the uses of graph-level variables and functions.

Analyses only read the IR; rewrites live in kiln.transform.
"""
