"""Memory per device of a plan: weights (and, in training, their gradients and optimizer state) + activations.

=================  ===============================================================================================
part               bytes per device
=================  ===============================================================================================
weights            the local pieces of the weights the device's ops read (a sliced weight counts its slice only)
weight state       training only, trainable weights only (``ir.WeightOrigin``; a constant — a folded mask, a
                   scalar, an integer table — has none): a gradient of the same size, and Adam's two fp32
                   moments (plus an fp32 master copy when the weight is 16-bit): ``(s + 8 + 4·[s < 4]) / s`` ×
                   the weight bytes, s = itemsize; once per source parameter (a tied weight, or a weight stored
                   whole and transposed, counts its largest piece once; a weight folded from several
                   parameters shares its bytes among them evenly)
activations        inference: the peak of the tensors alive at once, running the steps in order; training: the
                   activations some op's backward pass needs (below), each storage counted once, and the plan's
                   outputs (the loss reads them)
=================  ===============================================================================================

What a backward pass needs is its op family's ``saved`` hook (``unity_eq/ops/``), as PyTorch's autograd saves it:

=========================================  =====================================================================
ops                                        kept for the backward pass
=========================================  =====================================================================
MatMul, Gemm, Conv                         both operands (a weight operand is counted with the weights)
Mul, Div, Pow, Max, Min, PRelu             both operands
Gelu, Erf, Log, LayerNormalization…        their input
Relu, Sigmoid, Tanh, Exp, Softmax…         their output
Add, Sub, Neg, Cast, Concat, ReduceSum…    nothing
Reshape, Transpose, Squeeze, Slice, Split  nothing: their output is a view of their input (no copy), so keeping
                                           it keeps the input's storage, once
an op without a family (carried opaquely)  every tensor input (the conservative guess)
=========================================  =====================================================================

A collective's output (AllGather, AllReduce) is stored when a consumer keeps it; Replicated is its source. A
weight, what data layout makes of weights alone (the fused q/k/v weight) and a gathered weight are not
activations.

A tensor the caller holds once for several plans (a side tensor such as an attention mask, which a pipeline
stage receives once per microbatch and every layer of the stage reads) can be left out of a plan's
activations (``plan_memory(held_apart=…)``); :func:`kept_names` says which of them its backward keeps.

A plan fits when the total is at most the smallest device's usable memory (``memory × memory_fraction``).

The record a plan's bytes make (:class:`MemoryUsage`), the infeasibility message and the ZeRO levels (what a
device keeps of its weights' state when the data-parallel replicas shard it) are :mod:`unity_eq.memory_usage`'s,
re-exported here.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from typing_extensions import assert_never

from unity_eq.dtypes import is_float
from unity_eq.ir import WeightOrigin
from unity_eq.memory_usage import (
    ZERO_LEVELS,
    MemoryUsage,
    gib,
    infeasible_message,
    resident_bytes,
    shard_factors,
    weight_state_factor,
)
from unity_eq.ops.registry import family_for, spec_for
from unity_eq.plan import (
    CollectiveStep,
    Compute,
    LoadInput,
    LoadWeight,
    Plan,
    step_inputs,
    step_outputs,
)

__all__ = [
    "WEIGHT_KINDS",
    "ZERO_LEVELS",
    "MemoryUsage",
    "gib",
    "infeasible_message",
    "kept_names",
    "plan_memory",
    "resident_bytes",
    "shard_factors",
    "tensor_kinds",
    "weight_state_factor",
]

#: the kinds of weight tensors (``tensor_kinds``): trainable ones and constants; both are stored, not activations
WEIGHT_KINDS = ("weight", "constant")


def tensor_kinds(plan: Plan) -> dict[str, str]:
    """'weight' (trainable), 'constant' (a weight that is not: ``Plan.origin``), 'input', 'activation' or
    'nograd' (an integer or bool activation: no gradient) for every tensor; parallel ops keep their source's
    kind (the local ones; what a collective makes is an activation)."""
    kinds: dict[str, str] = {}
    for step in plan.steps:
        match step:
            case LoadWeight(out=out):
                kinds[out] = "weight" if plan.origin(step).trainable else "constant"
            case LoadInput(out=out):
                kinds[out] = "input"
            case CollectiveStep(out=out, src=src):
                kinds[out] = kinds.get(src, "activation") if step.kind.local else "activation"
            case Compute(outputs=outputs):
                for name in outputs:
                    if name:
                        dtype = plan.tensors[name].dtype
                        floating = dtype == "none" or is_float(dtype)
                        kinds[name] = "activation" if floating else "nograd"  # no gradient flows through it
            case _:
                assert_never(step)
    return kinds


def _resolve(plan: Plan) -> dict[str, str]:
    """Tensor -> the tensor whose storage it shares (a kind lowered as an alias, Replicated, is its source)."""
    alias: dict[str, str] = {}
    for step in plan.steps:
        if isinstance(step, CollectiveStep) and step.kind.lowering == "alias":
            alias[step.out] = alias.get(step.src, step.src)
    return alias


def plan_memory(
    plan: Plan, capacity: float | None = None, keep_outputs: bool = True, held_apart: Collection[str] = ()
) -> MemoryUsage:
    """Memory per device of ``plan`` (see the module docstring). ``keep_outputs=False``: in training, the plan's
    outputs are kept only if one of its own ops keeps them (a piece of a model whose output the next piece
    reads, and keeps there if it needs it, rather than a loss). ``held_apart``: model inputs and outputs (by
    name) that training's activations leave out, because the caller counts them once for several plans."""
    mesh = plan.mesh
    kinds = tensor_kinds(plan)
    alias = _resolve(plan)
    if capacity is None:
        capacity = min(plan.machine.usable_memory(d) for d in mesh.devices)

    # Weights: the pieces that ops (or collectives) read; a weight only sliced further is not stored whole.
    stored: set[str] = set()
    for step in plan.steps:
        if isinstance(step, LoadWeight) or (isinstance(step, CollectiveStep) and step.kind.local):
            continue
        for name in step_inputs(step):
            name = alias.get(name, name)
            if kinds.get(name) in WEIGHT_KINDS:
                stored.add(name)
    for name in plan.outputs.values():
        name = alias.get(name, name)
        if kinds.get(name) in WEIGHT_KINDS:
            stored.add(name)
    origins = _weight_origins(plan)
    weights = 0.0
    shares: dict[str, tuple[float, float]] = {}  # source parameter -> (its largest piece's bytes, state factor)
    for name in stored:
        t = plan.tensors[name]
        nbytes = float(t.local_bytes(mesh))
        weights += nbytes
        if plan.objective.training and t.dtype != "none" and kinds[name] == "weight":
            factor = weight_state_factor(np.dtype(t.dtype).itemsize)
            origin = origins[name]
            sources = origin.merged or origin.sources  # merged parameters: each its own gradient and state
            share = nbytes if len(sources) == 1 or origin.merged else nbytes / len(sources)
            for source in sources:
                if share > shares.get(source, (-1.0, 0.0))[0]:
                    shares[source] = (share, factor)
    state = 0.0
    gradients = 0.0
    for share, factor in shares.values():
        state += share * factor
        gradients += share

    activations = (
        _stored_activations(plan, kinds, keep_outputs, held_apart)
        if plan.objective.training
        else _peak_live(plan, kinds, alias)
    )
    return MemoryUsage(weights, state, activations, capacity, gradients if plan.objective.training else None)


def _weight_origins(plan: Plan) -> dict[str, WeightOrigin]:
    """The origin of every tensor that is a weight or a slice or replica of one (``Plan.origin``)."""
    found: dict[str, WeightOrigin] = {}
    for step in plan.steps:
        if isinstance(step, LoadWeight):
            found[step.out] = plan.origin(step)
        elif isinstance(step, CollectiveStep) and step.kind.local and step.src in found:
            found[step.out] = found[step.src]
    return found


def _is_activation_output(step: object, kinds: dict[str, str], name: str) -> bool:
    if isinstance(step, LoadWeight) or (isinstance(step, CollectiveStep) and step.kind.lowering == "alias"):
        return False
    return kinds.get(name) not in WEIGHT_KINDS


def _kept_by(step: Compute) -> tuple[str, ...]:
    """The tensors ``step``'s backward pass reads (its family's ``saved`` hook; every input for an opaque op)."""
    spec = spec_for(step.op_type, step.domain)
    family = family_for(step.op_type) if spec is not None else None
    if spec is None or family is None or family.saved is None:
        return step_inputs(step)
    saved = family.saved(step.op_type)
    kept = [_input(step, spec.input_index(arg)) for arg in saved.inputs]
    if saved.output:
        kept.extend(step_outputs(step))
    return tuple(name for name in kept if name)


def _input(step: Compute, index: int) -> str | None:
    """The tensor at input position ``index`` (None: a literal, an absent optional input, past the end)."""
    ref = step.inputs[index] if index < len(step.inputs) else None
    return ref if isinstance(ref, str) else None


def _storage(plan: Plan) -> dict[str, str]:
    """Tensor -> the tensor whose storage it is: Replicated is its source, a view (Reshape, Transpose, Slice…,
    the family's ``saved(op).view``) its input's storage; tensors that own their storage are not listed."""
    base: dict[str, str] = {}
    for step in plan.steps:
        source: str | None = None
        if isinstance(step, CollectiveStep) and step.kind.lowering == "alias":
            source = step.src
        elif isinstance(step, Compute):
            spec = spec_for(step.op_type, step.domain)
            family = family_for(step.op_type) if spec is not None else None
            view = family.saved(step.op_type).view if family is not None and family.saved is not None else None
            source = _input(step, spec.input_index(view)) if spec is not None and view is not None else None
        if source is not None:
            for name in step_outputs(step):
                base[name] = base.get(source, source)
    return base


def _weight_like(plan: Plan, kinds: dict[str, str]) -> set[str]:
    """Weights, and what data layout makes of weights alone (a Concat of the q, k and v weights: an initializer
    once lowered, ``OpSpec.foldable``) or a collective gathers of them (the backward gathers again, as ZeRO-3
    and FSDP do): none of them is an activation the backward keeps."""
    like = {name for name, kind in kinds.items() if kind in WEIGHT_KINDS}
    for step in plan.steps:
        match step:
            case Compute(op_type=op, domain=domain):
                spec = spec_for(op, domain)
                names = step_inputs(step)
                if spec is not None and spec.foldable and names and all(name in like for name in names):
                    like.update(step_outputs(step))
            case CollectiveStep(out=out, src=src):
                if src in like and step.kind.keeps_weights:
                    like.add(out)
            case LoadInput() | LoadWeight():
                pass
            case _:
                assert_never(step)
    return like


def _kept_storage(plan: Plan, kinds: dict[str, str], keep_outputs: bool = True) -> set[str]:
    """The storages the backward pass keeps: what some op keeps, plus the plan's outputs; weights left out."""
    base = _storage(plan)
    kept: set[str] = set()
    for step in plan.steps:
        if isinstance(step, Compute):
            kept.update(base.get(name, name) for name in _kept_by(step))
    if keep_outputs:
        kept.update(base.get(name, name) for name in plan.outputs.values())
    return kept - _weight_like(plan, kinds)


def _named(plan: Plan) -> dict[str, str]:
    """Model input and output names → the storage of their tensor in ``plan``."""
    base = _storage(plan)
    found = {step.name: step.out for step in plan.steps if isinstance(step, LoadInput)}
    found.update(plan.outputs)
    return {name: base.get(tensor, tensor) for name, tensor in found.items()}


def kept_names(plan: Plan, names: Collection[str]) -> frozenset[str]:
    """Which of the model inputs and outputs ``names`` the backward pass of ``plan`` keeps (training): those a
    caller holding them apart (``plan_memory(held_apart=…)``) must keep until the backward."""
    kept = _kept_storage(plan, tensor_kinds(plan), keep_outputs=False)
    named = _named(plan)
    return frozenset(name for name in names if named.get(name) in kept)


def _stored_activations(
    plan: Plan, kinds: dict[str, str], keep_outputs: bool = True, held_apart: Collection[str] = ()
) -> float:
    """Bytes of the activations kept for the backward pass: every storage some op keeps, once, plus the plan's
    outputs; a weight's storage is counted with the weights, a tensor ``held_apart`` by the caller."""
    kept = _kept_storage(plan, kinds, keep_outputs)
    named = _named(plan)
    kept -= {named[name] for name in held_apart if name in named}
    return float(sum(plan.tensors[name].local_bytes(plan.mesh) for name in kept))


def _peak_live(plan: Plan, kinds: dict[str, str], alias: dict[str, str]) -> float:
    """The largest sum of activation bytes alive at once when the steps run in order."""
    last_use: dict[str, int] = {}
    for index, step in enumerate(plan.steps):
        for name in step_inputs(step):
            last_use[alias.get(name, name)] = index
    end = len(plan.steps)
    for name in plan.outputs.values():
        last_use[alias.get(name, name)] = end
    frees: dict[int, list[str]] = {}
    live = 0.0
    peak = 0.0
    sizes: dict[str, float] = {}
    for index, step in enumerate(plan.steps):
        for name in step_outputs(step):
            if not _is_activation_output(step, kinds, name) or name in sizes:
                continue
            sizes[name] = float(plan.tensors[name].local_bytes(plan.mesh))
            live += sizes[name]
            frees.setdefault(last_use.get(name, index), []).append(name)
        peak = max(peak, live)
        for name in frees.pop(index, []):
            live -= sizes[name]
    return peak
