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
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = [
    "export_masked_transformer",
    "export_torch_transformer",
    "light_model_paths",
    "masked_inputs",
    "randomized_light_model",
]


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


def export_masked_transformer(
    kind: str,
    path: str | Path,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 2,
    seq: int = 16,
    vocab: int = 256,
    kv_heads: int = 1,
    attention: str = "sdpa",
    dynamo: bool = True,
    distinct: bool = False,
    parameters: str | Path | None = None,
    optimize: bool = True,
) -> Path:
    """Export a transformers GPT-2, BERT or LLaMA (``kind``: gpt2, bert, llama) built from a small config with
    random weights, as released models are: ``input_ids`` and ``attention_mask`` inputs, a dynamic batch, the
    dynamo exporter. Nothing is downloaded (HF_HUB_OFFLINE=1). The extended mask every layer reads is a side
    tensor of the split (docs/scale.md). ``kv_heads``: LLaMA's key/value heads (grouped-query attention when
    fewer than ``heads``); ``attention``: transformers' ``attn_implementation`` ("sdpa", its default:
    ``scaled_dot_product_attention``; "eager": the scores scaled and masked by hand); ``dynamo=False``: the
    TorchScript exporter (static shapes, opset 17), each spelling as exported models ship. ``distinct``: the
    norms' weights and biases perturbed first, so the exporter merges no two of them into one initializer
    (freshly initialized, all layers' are equal: training then refuses the merged weight, docs/training.md).
    ``parameters``: also write the model's parameter names there as JSON (``optimize --parameters``: then the
    rotary tables the exporter folds into initializers are constants, not parameters). ``optimize``: the dynamo
    exporter's own optimizer (it folds a weight's transpose into a new initializer and drops biases of zeros;
    off, every parameter keeps its name)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    path = Path(path)
    torch.manual_seed(0)
    if kind == "gpt2":
        config: Any = transformers.GPT2Config(
            n_layer=layers,
            n_embd=hidden,
            n_head=heads,
            n_positions=seq,
            vocab_size=vocab,
            bos_token_id=0,
            eos_token_id=0,
        )
        model: Any = transformers.GPT2Model(config)
    elif kind == "bert":
        config = transformers.BertConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
            vocab_size=vocab, max_position_embeddings=seq,
        )  # fmt: skip
        model = transformers.BertModel(config)
    elif kind == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
            intermediate_size=2 * hidden, vocab_size=vocab, max_position_embeddings=seq,
        )  # fmt: skip
        model = transformers.LlamaModel(config)
    else:
        raise ValueError(f"unknown transformers model kind {kind!r}")
    config.use_cache = False
    config._attn_implementation = attention
    model.eval()
    if distinct:
        with torch.no_grad():
            for module in model.modules():
                if "Norm" in type(module).__name__:
                    for param in module.parameters():
                        param.add_(0.1 * torch.randn_like(param))
    if parameters is not None:
        import json

        Path(parameters).write_text(json.dumps([name for name, _ in model.named_parameters()]))
    ids = torch.randint(0, vocab, (2, seq))
    mask = torch.ones(2, seq, dtype=torch.int64)
    if not dynamo:
        _export_torchscript(model, ids, mask, path)
        return path
    batch = torch.export.Dim("batch")
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            model, (ids,), kwargs={"attention_mask": mask}, dynamo=True, optimize=optimize,
            dynamic_shapes={"input_ids": {0: batch}, "attention_mask": {0: batch}},
        )  # fmt: skip
    assert program is not None
    program.save(str(path))
    return path


def _export_torchscript(model: Any, ids: Any, mask: Any, path: Path) -> None:
    """The TorchScript exporter (``dynamo=False``), through a module whose forward takes the two inputs by
    position (transformers' forward passes ``use_cache`` by keyword, which that exporter's tracing of keyword
    arguments collides with) and returns the last hidden state."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    with _quiet(), torch.no_grad():
        torch.onnx.export(
            Positional(model), (ids, mask), str(path), dynamo=False, opset_version=17,
            input_names=["input_ids", "attention_mask"],
        )  # fmt: skip


def masked_inputs(batch: int, seq: int = 16, vocab: int = 256, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for :func:`export_masked_transformer`'s models whose padding differs between the rows, so a mask
    routed to the wrong stage or microbatch changes the outputs. The last row is also padded on the left: under
    a causal mask its first queries see no key at all (issue 26's audit: onnxruntime's fused Attention gave
    such rows zeros where the model gives the mean of V, and `run` exited 0)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[0, seq // 2 :] = 0
    mask[batch - 1, seq - 3 :] = 0
    mask[batch - 1, :2] = 0
    return {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64), "attention_mask": mask}


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
