"""`kiln.mlf`: the Model Library Format reader, which lives in `kiln.runtime.mlf`
(a deploy host reads and runs an archive with numpy and a C compiler only).

    model = kiln.mlf.load("model.mlf.tar")
    (y,) = model(x)

Both import paths stay supported (docs/mlf.md); the writer is
`kiln.export_model_library_format`.
"""

from __future__ import annotations

from kiln.runtime.mlf import (
    METADATA_SCHEMA,
    READ_VERSIONS,
    MLFModel,
    load,
    probe_source,
    read_metadata,
    verify,
)

__all__ = ["METADATA_SCHEMA", "READ_VERSIONS", "MLFModel", "load", "probe_source",
           "read_metadata", "verify"]
