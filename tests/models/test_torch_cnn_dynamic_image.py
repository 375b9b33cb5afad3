"""A CNN exported by torch.onnx, both exporters, with the batch and the image height and
width dynamic (what detection and segmentation exports write): kiln compiles it with
every size symbolic, every convolution and pool on a hand-built kernel (no
PerformanceWarning: pytest turns warnings into errors), and matches onnxruntime at
sizes the export never saw."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln
from kiln.frontend import from_onnx
from support.reference import ort_session

torch = pytest.importorskip("torch")
hf_export = pytest.importorskip("hf_export")

AXES = {0: "batch", 2: "height", 3: "width"}


def fcn() -> Any:
    """A small fully convolutional net: a 7x7/2 stem with BatchNorm, a max pool, a
    residual block, a MobileNet block (depthwise 3x3/2, ReLU6), a grouped 3x3 layer, an
    average pool and a 1x1 head: an output map whose size follows the input's."""
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False),
                                      nn.BatchNorm2d(16), nn.ReLU())
            self.pool = nn.MaxPool2d(3, 2, 1)
            self.res = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1), nn.ReLU(),
                                     nn.Conv2d(16, 16, 3, 1, 1))
            self.mobile = nn.Sequential(nn.Conv2d(16, 16, 3, 2, 1, groups=16), nn.ReLU6(),
                                        nn.Conv2d(16, 24, 1), nn.ReLU6())
            self.grouped = nn.Conv2d(24, 24, 3, 1, 1, groups=3)
            self.avg = nn.AvgPool2d(2, 2)
            self.head = nn.Conv2d(24, 5, 1)

        def forward(self, x: Any) -> Any:
            h = self.pool(self.stem(x))
            h = torch.relu(h + self.res(h))
            return self.head(self.avg(torch.relu(self.grouped(self.mobile(h)))))

    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():  # BatchNorm statistics other than the identity's
        net.stem[1].running_mean.uniform_(-0.5, 0.5)
        net.stem[1].running_var.uniform_(0.5, 1.5)
    return net


@pytest.mark.parametrize("exporter", hf_export.EXPORTERS)
def test_a_cnn_with_a_dynamic_image_size_runs_hand_built_kernels(exporter: str) -> None:
    example = torch.randn(1, 3, 64, 64)
    model = hf_export.export_module(fcn(), (example,), ["x"], ["y"], exporter, {"x": AXES},
                                    ({k: str(v) for k, v in AXES.items()},))
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim] == \
        ["batch", "", "height", "width"]
    ex = kiln.compile(from_onnx(model), "llvm")
    convs = [f.attrs["kiln.conv_kernel"] for f in ex.ir.functions.values()
             if hasattr(f, "attrs") and "kiln.conv_kernel" in f.attrs]
    pools = [f for f in ex.ir.functions.values()
             if hasattr(f, "attrs") and "kiln.pool_kernel" in f.attrs]
    assert len(convs) == 7 and len(pools) == 2, (convs, len(pools))
    session = ort_session(model)
    rng = np.random.default_rng(1)
    for shape in ((1, 3, 64, 48), (2, 3, 37, 53), (1, 3, 130, 17)):
        x = rng.standard_normal(shape).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        got = np.asarray(ex["main"](x))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
