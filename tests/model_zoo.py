"""Real models for tests: onnx's bundled model-zoo CNNs (with random weights) and a PyTorch export.

A plain module, imported by tests; nothing here is collected by pytest.

onnx's ``backend/test/data/light`` models have real topologies but compute every weight with
``ConstantOfShape(0.02)``, so all channels are equal and a wrong slice or a dropped term can go unnoticed
numerically. :func:`randomized_light_model` replaces those weights with random initializers.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["export_torch_transformer", "light_model_paths", "randomized_light_model"]


def light_model_paths() -> list[Path]:
    """Every ``onnx/backend/test/data/light/*.onnx`` of the installed onnx package, sorted by name."""
    return sorted((Path(onnx.__file__).parent / "backend" / "test" / "data" / "light").glob("*.onnx"))


def randomized_light_model(path: str | Path, out_dir: str | Path, seed: int = 0) -> Path:
    """Copy a light model to ``out_dir`` with random weights in place of its ``ConstantOfShape`` ones.

    Each ``ConstantOfShape`` whose shape is an initializer becomes an initializer of the same name holding
    normal samples times 1/sqrt(fan_in), fan_in being the product of the dims after the first (at least 1).
    The one exception: a tensor used as a BatchNormalization variance gets ``|normal| + 0.5`` instead, since
    a negative variance makes the output NaN. Shape initializers left unused are removed; the rest of the
    model (IR version, opset, nodes) is unchanged, so the copy passes ``onnx.checker`` and runs in
    onnxruntime (``tests/test_frontend.py`` checks both; checking here too would double the time).
    """
    path, out_dir = Path(path), Path(out_dir)
    model = onnx.load(path)
    graph = model.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    variances = {n.input[4] for n in graph.node if n.op_type == "BatchNormalization" and len(n.input) > 4}
    rng = np.random.default_rng(seed)

    weights: list[onnx.TensorProto] = []
    kept_nodes = []
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in shapes:
            kept_nodes.append(node)
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        value = _constant_of_shape_value(node)
        if not np.issubdtype(value.dtype, np.floating):
            data = np.full(shape, value.reshape(-1)[0])  # not a weight (a mask or an index): keep the fill
        elif node.output[0] in variances:
            data = np.abs(rng.standard_normal(shape, dtype=np.float32)) + np.float32(0.5)
        else:
            data = rng.standard_normal(shape, dtype=np.float32)
            data *= np.float32(1 / math.sqrt(max(1, math.prod(shape[1:]))))
        weights.append(numpy_helper.from_array(data.astype(value.dtype, copy=False), node.output[0]))

    still_read = {name for node in kept_nodes for name in node.input}
    dropped = {name for name in shapes if name not in still_read}
    del graph.node[:]
    graph.node.extend(kept_nodes)
    initializers = [t for t in graph.initializer if t.name not in dropped] + weights
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    # IR 3 wants every initializer declared as a graph input as well.
    inputs = [i for i in graph.input if i.name not in dropped]
    if model.ir_version < 4:
        inputs += [helper.make_tensor_value_info(w.name, w.data_type, w.dims) for w in weights]
    del graph.input[:]
    graph.input.extend(inputs)

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / path.name
    onnx.save(model, out)
    return out


def _constant_of_shape_value(node: onnx.NodeProto) -> np.ndarray:
    """The fill value of a ConstantOfShape (float32 0 when the attribute is absent, as ONNX specifies)."""
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
    return np.zeros(1, np.float32)


def export_torch_transformer(
    path: str | Path,
    seed: int = 0,
    *,
    d_model: int = 64,
    nhead: int = 4,
    ffn: int = 256,
    batch: int = 2,
    seq: int = 16,
) -> Path:
    """Export a random ``nn.TransformerEncoderLayer`` (default input [2, 16, 64]) with torch's dynamo exporter.

    LayerNorm weights are perturbed away from their ones/zeros defaults so that every parameter matters
    numerically (the exporter would otherwise also merge the two norms' identical weights).
    """
    import torch  # a dev dependency; imported here so the module loads without it

    path = Path(path)
    torch.manual_seed(seed)
    model = torch.nn.TransformerEncoderLayer(
        d_model=d_model, nhead=nhead, dim_feedforward=ffn, batch_first=True, dropout=0.0
    ).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.add_(0.1 * torch.randn_like(module.weight))
                module.bias.add_(0.1 * torch.randn_like(module.bias))
    x = torch.randn(batch, seq, d_model)
    with _quiet():
        program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
    assert program is not None
    program.save(str(path))
    return path


@contextlib.contextmanager
def _quiet():
    """Silence the exporter's progress lines, its logged notices and its deprecation warnings."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
