"""A decoder exported with torch's `Dim.AUTO` on every axis: one size, many names.

With `Dim.AUTO` (or `Dim.DYNAMIC`) torch names each input's axes apart: a tiny GPT-2
with past key/values gets `s15` for every batch but one name per cache tensor for the
past length (`s20` for the first keys, `s8` for the first values, ...) and another for
the attention mask. The graph needs them equal (the mask is added to the scores over
`past + seq` positions); kiln makes each such set one variable
(kiln.frontend.onnx.importer), so the export imports with no pins, matches onnxruntime,
and a call whose cache tensors disagree is refused rather than read out of bounds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from support.reference import ort_session

pytest.importorskip("torch", reason="exporting transformers models needs torch")
pytest.importorskip("transformers", reason="the models are built with transformers")
pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")

import hf_decoders
import hf_export

import kiln
from kiln.errors import CallError
from kiln.ir.shape_expr import dim_text

SIZES = ({"batch": 1, "seq": 3, "past_seq": 0}, {"batch": 2, "seq": 1, "past_seq": 5})


def _export_auto(decoder: hf_decoders.Decoder) -> Any:
    import torch

    module = decoder.build()
    example = tuple(torch.from_numpy(a) for a in
                    hf_decoders.feeds(decoder, hf_decoders.EXAMPLE_SIZES).values())
    axes = {i.name: {k: d for k, d in enumerate(i.dims) if isinstance(d, str)}
            for i in decoder.inputs}
    shapes = tuple({k: torch.export.Dim.AUTO for k, d in enumerate(i.dims)
                    if isinstance(d, str)} for i in decoder.inputs)
    return hf_export.export_module(module, example, [i.name for i in decoder.inputs],
                                   list(decoder.outputs), "dynamo", dynamic_axes=axes,
                                   dynamic_shapes=(shapes,))


@pytest.mark.slow  # an export and a compile: runs first (tests/conftest.py)
def test_gpt2_with_auto_dims_imports_unpinned_and_matches_onnxruntime() -> None:
    decoder = hf_decoders.gpt2(2, past=True, vocab=101, width=(64, 4), eager=False)
    model = _export_auto(decoder)
    declared = {d.dim_param for i in model.graph.input
                for d in i.type.tensor_type.shape.dim if d.dim_param}
    module = kiln.frontend.from_onnx(model)   # no pins
    dims = {p.name: [dim_text(d) for d in p.type.shape] for p in module["main"].params}
    pasts = {dims[i.name][2] for i in decoder.inputs[1:]}
    assert len(pasts) == 1 and len(declared) > 4, (declared, dims)   # one past length
    main = kiln.compile(module, "llvm")["main"]
    session = ort_session(model)
    for sizes in SIZES:
        feeds = hf_decoders.feeds(decoder, sizes, seed=sum(sizes.values()))
        wants = session.run(None, feeds)
        gots = main(*feeds.values())
        for name, got, want in zip(decoder.outputs, gots, wants, strict=True):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name} at {sizes}")
    feeds = hf_decoders.feeds(decoder, SIZES[1], seed=0)
    args = list(feeds.values())
    args[2] = args[2][:, :, :3]   # the first values 3 long, the first keys 5
    with pytest.raises(CallError, match="dimension"):
        main(*args)
