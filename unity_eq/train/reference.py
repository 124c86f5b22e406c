"""The original model on one device, in PyTorch: the reference ``check --training`` compares a plan's training
with. It runs the ONNX graph node by node with the same op table the ranks use (unity_eq.train.torch_ops), its
float initializers as parameters (the source model's names), so both sides train with the same arithmetic."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import onnx
import torch
from onnx import numpy_helper

from unity_eq.errors import ModelError
from unity_eq.ir import is_parameter_type
from unity_eq.train.torch_ops import refuse_unknown, run_op, tensor_of

__all__ = ["OnnxModule", "node_attrs", "trainable_names"]


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as plain values (strings decoded, tensors as numpy arrays)."""
    attrs: dict[str, Any] = {}
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, onnx.GraphProto):
            raise ModelError(f"node {node.name or node.op_type}: {node.op_type} with a subgraph cannot train here")
        attrs[attr.name] = value
    return attrs


def trainable_names(model: onnx.ModelProto) -> set[str]:
    """The model's parameters: its float initializers of rank 1 or more (``ir.is_parameter_type``, the rule the
    frontend's ``Graph.origins`` and so the cost and memory models use). Integer ones are shapes and indices;
    a scalar is an exporter's constant (GELU's 0.5 and 0.044715, a Pow's exponent 3, a mask's fill value
    -3.4e38: torch's dynamo exporter writes them as initializers), never a module's parameter. The values are
    not read (external data stays where it is)."""
    return {
        tensor.name
        for tensor in model.graph.initializer
        if is_parameter_type(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type), len(tensor.dims))
    }


class OnnxModule(torch.nn.Module):
    """An ONNX model as a module: ``forward(inputs)`` returns its outputs by name; ``parameters_by_name`` its
    float initializers."""

    def __init__(
        self,
        path: str | Path | onnx.ModelProto,
        device: torch.device | str = "cpu",
        trainable: Collection[str] | None = None,
    ) -> None:
        """``trainable``: the initializers to train (a plan's, plan.json ``weights``); default
        :func:`trainable_names`."""
        super().__init__()
        model = path if isinstance(path, onnx.ModelProto) else onnx.load(str(path))
        self.graph = model.graph
        refuse_unknown(((n.op_type, n.domain, n.name) for n in self.graph.node), str(path))
        train = trainable_names(model) if trainable is None else set(trainable)
        self.names: list[str] = []
        self.params = torch.nn.ParameterList()
        self.consts: dict[str, torch.Tensor] = {}
        for tensor in self.graph.initializer:
            value = tensor_of(numpy_helper.to_array(tensor), device)
            if tensor.name in train:
                self.names.append(tensor.name)
                self.params.append(torch.nn.Parameter(value))
            else:
                self.consts[tensor.name] = value
        self.attrs = [node_attrs(n) for n in self.graph.node]

    def parameters_by_name(self) -> dict[str, torch.nn.Parameter]:
        return dict(zip(self.names, self.params, strict=True))

    def forward(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        env: dict[str, torch.Tensor] = dict(self.consts)
        env.update(self.parameters_by_name())
        env.update(inputs)
        for node, attrs in zip(self.graph.node, self.attrs, strict=True):
            args = [env[i] if i else None for i in node.input]
            results = run_op(node.op_type, args, attrs, len(node.output), node.domain, onnx=True)
            for name, value in zip(node.output, results, strict=False):
                if name:
                    env[name] = value
        return {o.name: env[o.name] for o in self.graph.output}
