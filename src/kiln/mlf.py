"""`kiln.mlf`: the Model Library Format reader, which lives in `kiln.runtime.mlf`
(a deploy host reads and runs an archive with numpy and a C compiler only).

    model = kiln.mlf.load("model.mlf.tar")
    (y,) = model(x)

Both import paths stay supported (docs/mlf.md); the writer is
`kiln.export_model_library_format`.
"""

from __future__ import annotations

from kiln.runtime.mlf import (
    CHECKSUMS_SCHEMA,
    CHECKSUMS_SINCE,
    METADATA_SCHEMA,
    READ_VERSIONS,
    MLFModel,
    UncheckedArchiveWarning,
    UncheckedParametersWarning,
    extract_checked,
    load,
    metadata_digest,
    probe_source,
    read_metadata,
    verify,
)

__all__ = ["CHECKSUMS_SCHEMA", "CHECKSUMS_SINCE", "METADATA_SCHEMA", "READ_VERSIONS",
           "MLFModel", "UncheckedArchiveWarning", "UncheckedParametersWarning",
           "extract_checked", "load", "metadata_digest", "probe_source", "read_metadata",
           "verify"]
