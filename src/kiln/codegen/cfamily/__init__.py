"""C-family text shared by the `c` backend and the host entry points both backends ship.

`kiln.codegen.host` writes `host.c` for the `c` and `llvm` backends alike, so what
it needs lives here rather than in `kiln.codegen.c`: the C text printer and name
scopes (`printer`), literals (`literals`), the runtime helper functions (`helpers`),
parameter qualifiers and types (`signature`), and the dialect object (`dialect`) that
tells the C printer what another C-family language (CUDA) spells differently.
"""
