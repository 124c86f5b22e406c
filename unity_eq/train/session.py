"""Training a plan in this process, one rank of it: the Python API (docs/training.md).

:func:`load_rank` reads a plan directory for this process's rank of ``torch.distributed`` (started by torchrun,
or by :func:`unity_eq.train.check.spawn_ranks`) and returns a :class:`RankTrainer`: its ``module`` is a
``torch.nn.Module`` whose parameters are this rank's shards; call it on the model inputs, take the loss,
``backward()``, step any optimizer over ``module.parameters()``, and :meth:`RankTrainer.save` a checkpoint of
the whole model in the source model's parameter names.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from unity_eq.collectives import torch_autograd as coll
from unity_eq.errors import ModelError, OptionError, PlanError
from unity_eq.ir import WeightOrigin
from unity_eq.planfile import ExplainRecord, WeightStepRecord, read_explain_record
from unity_eq.train.rank import RankModule, Region

__all__ = ["RankTrainer", "load_rank", "loss_of", "mesh_groups", "read_training_plan"]

PIPELINE_REFUSAL = (
    "pipeline training is not built yet: `train` and `check --training` run SPMD plans (one plan directory, "
    "no stages). Re-run `unity-eq optimize --objective training` with `--mesh` to get an SPMD plan."
)


def read_training_plan(plan_dir: str | Path) -> ExplainRecord:
    """plan.json of an SPMD plan directory, checked as ``run`` checks it; a pipeline plan is refused."""
    import json

    from unity_eq.runtime.plandir import load_plan_dir

    root = Path(plan_dir)
    try:
        kind = json.loads((root / "plan.json").read_text()).get("plan")
    except (OSError, ValueError, AttributeError):
        kind = None  # load_plan_dir says what is wrong with the directory
    if kind == "pipeline":
        raise PlanError(f"{root}: {PIPELINE_REFUSAL}")
    load_plan_dir(root, check_files=False)  # the checks `run` makes: a plan directory, not plan-only, collectives
    return read_explain_record(root / "plan.json")


def mesh_groups(record: ExplainRecord) -> dict[str, list[tuple[int, ...]]]:
    """Every mesh axis's groups (ranks differing only along it, in axis order), as plan.json's collectives name
    them."""
    sizes = list(record.mesh.sizes)
    ranks = np.arange(int(np.prod(sizes)), dtype=np.int64).reshape(sizes)
    return {
        axis: [tuple(int(r) for r in row) for row in np.moveaxis(ranks, i, -1).reshape(-1, sizes[i]).tolist()]
        for i, axis in enumerate(record.mesh.axes)
    }


def make_groups(record: ExplainRecord, rank: int, ledger: coll.Ledger, ordered_sum: bool) -> dict[str, coll.AxisGroup]:
    """This rank's process group on every mesh axis. Every rank creates every group, in the same order, as
    torch.distributed requires."""
    out: dict[str, coll.AxisGroup] = {}
    for axis, groups in mesh_groups(record).items():
        for ranks in groups:
            group = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            if rank in ranks:
                out[axis] = coll.AxisGroup(axis, ranks, ranks.index(rank), group, ledger, ordered_sum)
    return out


def refuse_merged(record: ExplainRecord, shared: Collection[str], model: str | Path) -> None:
    """One error line for a weight plan.json marks as maybe several source parameters merged into one by the
    exporter (``weights[].ambiguous``: ``Graph.ambiguous_weights``), unless ``shared`` says it is one
    parameter: training it as one would silently tie parameters the source model trains apart."""
    for name, weight in record.weights.items():
        if weight.merged:
            raise ModelError(
                f"{model}: weight {name!r} holds the source parameters {', '.join(weight.merged)} (the exporter "
                "merged them; `--parameters` says so): one weight cannot train them apart. Re-export the model "
                "with those parameters made distinct."
            )
    flagged = sorted(name for name, w in record.weights.items() if w.ambiguous and name not in shared)
    if flagged:
        first = flagged[0]
        also = f" ({', '.join(repr(n) for n in flagged[1:])} likewise)" if flagged[1:] else ""
        flags = " ".join(f"--shared {n}" for n in flagged)
        raise ModelError(
            f"{model}: weight {first!r} is {record.weights[first].ambiguous}{also}: torch's dynamo exporter merges "
            "parameters with equal values into one initializer, and training it would tie them. Re-export the model "
            f"with those parameters made distinct, or pass `{flags}` if the source model shares them."
        )


def source_weights(
    model: str | Path, record: ExplainRecord, shared: Collection[str] = ()
) -> tuple[dict[str, Any], set[str], dict[str, Derivation]]:
    """The source model's weights as the plan names them (the frontend's initializers at the plan's input
    shapes), the source parameters (the frontend's ``Graph.origins``: the one definition of trainable that
    the cost and memory models price) and the weights the frontend folded from parameters (a ``Transpose(W)``
    it made an initializer ``Wt``): those the ranks compute again from the parameters (:class:`Derivation`),
    so their gradients reach the source weights. A weight that may be merged parameters
    (``Graph.ambiguous_weights``) is refused unless ``shared`` names it (the user says it is one)."""
    import onnx

    from unity_eq.frontends.onnx import load_onnx
    from unity_eq.weightfile import value_of

    shapes = {name: tuple(spec.shape) for name, spec in record.model.inputs.items()}
    graph = load_onnx(model, shapes)
    refuse_merged(record, shared, model)
    proto = onnx.load(str(model))
    origins = weight_origins(record, graph)
    trainable = {source for origin in origins.values() if origin.trainable for source in origin.sources}
    weights = {name: value_of(v) for name, v in graph.initializers.items()}
    loaded = {s.name for s in record.steps if isinstance(s, WeightStepRecord)}
    folded = {name for name in loaded if name in origins and origins[name].how == "folded"}
    derived = derivations(proto, folded, trainable)
    for d in derived.values():
        for name in d.sources:
            if name not in weights:  # pruned by the frontend: only the fold read it
                init = next(t for t in proto.graph.initializer if t.name == name)
                weights[name] = onnx.numpy_helper.to_array(init)
    return weights, trainable, derived


def weight_origins(record: ExplainRecord, graph: Any) -> dict[str, WeightOrigin]:
    """Every weight's origin as plan.json records it (``weights``: what the plan was priced with, the user's
    ``--parameters`` map included); a plan written before the section, the frontend's again."""
    if not record.weights:
        return dict(graph.weight_origins())
    return {
        name: WeightOrigin(w.how, w.sources, w.ops, w.merged) if w.trainable else WeightOrigin.constant(w.ops)
        for name, w in record.weights.items()
    }


@dataclass(frozen=True)
class Derivation:
    """How the source ONNX graph computes a tensor the frontend folded into an initializer: its nodes (op,
    domain, inputs, outputs, attrs) in order, from the trainable initializers ``sources``."""

    nodes: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...], dict[str, Any]], ...]
    sources: tuple[str, ...]


def derivations(model: Any, names: set[str], trainable: set[str]) -> dict[str, Derivation]:
    """For each of ``names`` (folded initializers) that a trainable initializer flows into, its subgraph."""
    from unity_eq.train.reference import node_attrs

    producer = {out: node for node in model.graph.node for out in node.output}
    out: dict[str, Derivation] = {}
    for name in sorted(names):
        if name not in producer:
            continue
        needed: list[Any] = []
        sources: set[str] = set()
        stack, seen = [name], set()
        while stack:
            tensor = stack.pop()
            if tensor in seen or not tensor:
                continue
            seen.add(tensor)
            if tensor in trainable:
                sources.add(tensor)
            elif tensor in producer:
                node = producer[tensor]
                if node not in needed:
                    needed.append(node)
                stack.extend(node.input)
        if sources:
            order = [n for n in model.graph.node if n in needed]
            nodes = tuple((n.op_type, n.domain, tuple(n.input), tuple(n.output), node_attrs(n)) for n in order)
            out[name] = Derivation(nodes, tuple(sorted(sources)))
    return out


def loss_of(outputs: Mapping[str, torch.Tensor], how: str | None) -> torch.Tensor:
    """The loss: the model's first output when it is a scalar, else ``how`` (``sum`` or ``mean``) over it."""
    first = next(iter(outputs.values()))
    if how is None:
        if first.numel() != 1:
            name = next(iter(outputs))
            raise OptionError(
                f"the model's first output {name!r} has shape {list(first.shape)}, not a scalar loss. Pass "
                "`--loss sum` or `--loss mean` to train on its sum or mean."
            )
        return first.reshape(())
    if how == "sum":
        return first.sum()
    if how == "mean":
        return first.mean()
    raise OptionError(f"`--loss`: expected sum or mean, got {how!r}.")


def pick_device(device: str, local_rank: int) -> torch.device:
    """``cpu``, ``cuda`` (one GPU per local rank, round robin) or ``auto`` (cuda when available)."""
    if device not in ("cpu", "cuda", "auto"):
        raise OptionError(f"`--device`: expected cpu, cuda or auto, got {device!r}.")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise OptionError("`--device cuda`: torch sees no CUDA device. Use `--device cpu` or `auto`.")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


@dataclass
class RankTrainer:
    """One rank's training state: the module (this rank's shards as parameters), its ledger of collectives."""

    record: ExplainRecord
    rank: int
    module: RankModule
    ledger: coll.Ledger
    device: torch.device

    @property
    def world_size(self) -> int:
        return len(self.record.mesh.ranks)

    def inputs(self, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Model inputs as tensors on this rank's device (every rank passes the whole batch)."""
        return {name: torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for name, a in arrays.items()}

    def shards(self) -> list[tuple[str, Region, torch.nn.Parameter]]:
        return self.module.named_shards()

    def gather_full(self, what: str = "weights") -> dict[str, np.ndarray] | None:
        """The whole model's weights (or gradients: ``what="grads"``) in the source names, assembled from every
        rank's shards; returned on rank 0 (None elsewhere). Every rank must call it."""
        mine = []
        for name, region, param in self.shards():
            value = param.detach() if what == "weights" else param.grad
            if value is None:
                value = torch.zeros_like(param)
            mine.append((name, region.box, value.cpu().numpy()))
        pieces: list[Any] = [None] * self.world_size
        dist.all_gather_object(pieces, mine)
        if self.rank != 0:
            return None
        return assemble(pieces, self.module.source_shapes)

    def save(self, path: str | Path) -> Path | None:
        """Write the whole model's weights in the source names (safetensors when installed, else torch's
        format), atomically, from rank 0. Every rank must call it."""
        from unity_eq.train.checkpoint import write_checkpoint

        full = self.gather_full("weights")
        if full is None:
            return None
        return write_checkpoint(Path(path), full)

    def load(self, path: str | Path) -> None:
        """Set this rank's shards from a checkpoint of the whole model (source names and shapes)."""
        from unity_eq.train.checkpoint import read_checkpoint

        full = read_checkpoint(Path(path))
        for name, region, param in self.shards():
            if name not in full:
                raise OptionError(f"`--load` {path}: has no parameter {name!r}, which the plan trains.")
            value = full[name]
            expected = self.module.source_shapes[name]
            if tuple(value.shape) != expected:
                raise OptionError(
                    f"`--load` {path}: parameter {name!r} has shape {list(value.shape)}, the model's is "
                    f"{list(expected)}. Load a checkpoint of this model."
                )
            with torch.no_grad():
                param.copy_(torch.from_numpy(np.ascontiguousarray(value[region.index()])))


def assemble(pieces: Sequence[Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Whole tensors from every rank's ``(name, box, value)`` pieces (replicas write the same region)."""
    out: dict[str, np.ndarray] = {}
    for rank_pieces in pieces:
        for name, box, value in rank_pieces:
            if name not in out:
                out[name] = np.zeros(shapes[name], value.dtype)
            out[name][tuple(slice(s, s + n) for s, n in box)] = value
    return out


def load_rank(
    plan_dir: str | Path,
    model: str | Path | None = None,
    *,
    device: str = "cpu",
    rank: int | None = None,
    ordered_sum: bool | None = None,
    shared: Collection[str] = (),
) -> RankTrainer:
    """This process's rank of ``plan_dir`` (torch.distributed must be initialized, with the plan's number of
    ranks). ``model``: the source ONNX model whose weights start training (default: plan.json's
    ``model.source``). ``shared``: weights the source model really shares, which look merged by the exporter
    (:func:`refuse_merged`)."""
    if not dist.is_initialized():
        raise OptionError("torch.distributed is not initialized: start the ranks with torchrun, or call "
                          "torch.distributed.init_process_group first.")  # fmt: skip
    record = read_training_plan(plan_dir)
    world = len(record.mesh.ranks)
    if dist.get_world_size() != world:
        raise OptionError(
            f"world size: {dist.get_world_size()} processes were started, the plan in {plan_dir} has {world} ranks. "
            f"Run `torchrun --nproc_per_node {world} -m unity_eq train {plan_dir}`."
        )
    rank = dist.get_rank() if rank is None else rank
    source = Path(model) if model is not None else Path(record.model.source)
    if not source.is_file():
        raise OptionError(
            f"{source}: the model the plan was made from is not there; its weights start training. Pass the model "
            "(`--model`) or a checkpoint (`--load`)."
        )
    weights, trainable, derived = source_weights(source, record, shared)
    ledger = coll.Ledger()
    torch_device = pick_device(device, int(os.environ.get("LOCAL_RANK", rank)))
    ordered = torch_device.type == "cpu" if ordered_sum is None else ordered_sum
    groups = make_groups(record, rank, ledger, ordered)
    module = RankModule(record, rank, weights, trainable, groups, torch_device, derived)
    return RankTrainer(record, rank, module, ledger, torch_device)
