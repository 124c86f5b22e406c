"""Candidate meshes: the logical meshes of 1 to 3 axes over the machine's devices, and the pruning of equivalent,
misaligned and useless ones (see unity_eq.search).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from unity_eq.cost import INFERENCE, CostModel, Objective
from unity_eq.ir import AXIS_NAMES, Graph, Mesh, divisors, machine_order
from unity_eq.machine import GroupTopology, Machine
from unity_eq.planfile.axes import axis_info
from unity_eq.report import device_span
from unity_eq.search.trial import MeshTrial, TrialStatus


def _factorizations(n: int, max_axes: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of n into 1..max_axes factors, each at least 2 (n itself when n < 2).

    Walks n's divisors (at most a few hundred below 2**20), not every integer up to n."""
    if n < 2:
        return [(max(n, 1),)]
    sizes_of_n = divisors(n)
    found: list[tuple[int, ...]] = []

    def rec(rest: int, prefix: tuple[int, ...]) -> None:
        if rest == 1:
            if prefix:
                found.append(prefix)
            return
        if len(prefix) == max_axes:
            return
        for f in sizes_of_n:
            if f > rest:
                break
            if f >= 2 and rest % f == 0:
                rec(rest // f, (*prefix, f))

    rec(n, ())
    return sorted(found, key=lambda sizes: (len(sizes), sizes))


def _mesh_key(model: CostModel) -> tuple[Any, ...]:
    return tuple(sorted(repr((model.mesh.axis_size(a), model.group_topologies(a))) for a in model.mesh.axes))


def _misaligned(model: CostModel) -> str | None:
    for axis in model.mesh.axes:
        tops: set[GroupTopology] = set(model.group_topologies(axis))
        if len({(t.k, t.m) for t in tops}) > 1:
            return f"axis {axis}'s groups sit differently on the nodes"
        if model.uneven_groups(axis):
            return f"axis {axis} holds an unequal number of ranks on its nodes"
    return None


def _usable_sizes(graph: Graph) -> set[int]:
    """Every axis size that divides some tensor dimension (the divisors ≥ 2 of the dimensions)."""
    dims = {d for t in graph.types.values() for d in t.shape if d > 1}
    return {n for d in dims for n in divisors(d) if n >= 2}


def candidate_meshes(
    machine: Machine, graph: Graph, objective: Objective = INFERENCE, max_axes: int = 3
) -> list[MeshTrial]:
    """Every factorization of the machine's devices into 1..max_axes axes; pruned ones carry their reason.

    On a machine of several kinds of device or node (see device_groups), the same again over each kind's
    devices alone (after the meshes over all devices), unless another group dominates it."""
    n = machine.device_count
    usable = _usable_sizes(graph)
    trials = _meshes_over(machine, machine_order(n), "", "", usable, objective, max_axes)
    groups = device_groups(machine)
    if len(groups) < 2:
        return trials
    for group in groups:
        if len(group) < 2:
            continue  # one device alone: the one-device plan (on the fastest device) stands for it
        ids = machine_order(len(group)) if group == tuple(range(len(group))) else group
        scope = device_span(group)
        kind = machine.devices[group[0]].name
        better = next((g for g in groups if g is not group and _dominates(machine, g, group)), None)
        if better is not None:  # one entry for the group: none of its meshes is laid out
            trial = MeshTrial(Mesh(("x",), (len(ids),), ids), (), scope=scope, device_kind=kind)
            trial.status = TrialStatus.SKIPPED
            trial.reason = (
                f"dominated: {device_span(better)} ({machine.devices[better[0]].name}) are as many, no slower, "
                f"no smaller and no worse linked than {scope} ({kind}); no mesh over them is tried"
            )
            trials.append(trial)
            continue
        trials += _meshes_over(machine, ids, scope, kind, usable, objective, max_axes)
    return trials


def _meshes_over(
    machine: Machine,
    devices: tuple[int, ...],
    scope: str,
    kind: str,
    usable: set[int],
    objective: Objective,
    max_axes: int,
) -> list[MeshTrial]:
    """The meshes over ``devices`` (all the machine's when ``scope`` is empty), pruned."""
    n = len(devices)
    trials: list[MeshTrial] = []
    seen: dict[tuple[Any, ...], str] = {}
    for sizes in _factorizations(n, max_axes):
        mesh = Mesh(AXIS_NAMES[: len(sizes)], sizes, devices)
        model = CostModel(machine, mesh, objective)
        trial = MeshTrial(mesh, tuple(axis_info(model, a) for a in mesh.axes), scope=scope, device_kind=kind)
        trials.append(trial)
        if n < 2:
            continue
        useless = [s for s in sizes if s not in usable]
        # the 1-axis mesh over all devices is always tried: the baselines are priced on it
        if useless and (len(sizes) > 1 or scope):
            trial.status, trial.reason = TrialStatus.SKIPPED, f"no tensor dimension divides by {useless[0]}"
            continue
        bad = _misaligned(model)
        if bad:
            trial.status, trial.reason = TrialStatus.SKIPPED, f"misaligned: {bad}"
            continue
        key = _mesh_key(model)
        if key in seen:
            trial.status, trial.reason = TrialStatus.SKIPPED, f"equivalent to {seen[key]}"
            continue
        seen[key] = trial.label
    return trials


def device_groups(machine: Machine) -> list[tuple[int, ...]]:
    """The machine's devices grouped by kind: the same device on nodes of the same kind (link, network and
    NICs), in machine order. One group (the whole machine) when the machine is homogeneous."""
    names = {d.name for d in machine.devices}
    node_kind, _ = machine.node_kinds
    if len(names) == 1 and len(set(node_kind.tolist())) <= 1:
        return [machine_order(machine.device_count)]
    groups: dict[tuple[str, int], list[int]] = {}
    for device, (spec, node) in enumerate(zip(machine.devices, machine.node_of, strict=True)):
        groups.setdefault((spec.name, int(node_kind[node])), []).append(device)
    return [tuple(g) for g in groups.values()]


def _dominates(machine: Machine, better: tuple[int, ...], worse: tuple[int, ...]) -> bool:
    """Whether the group ``better`` would give every mesh of ``worse`` a plan at least as cheap: as many
    devices, spread alike over their nodes, each at least as fast and large, on links at least as good."""
    if len(better) != len(worse):
        return False
    per_node = [sorted(Counter(machine.node_of[d] for d in g).values()) for g in (better, worse)]
    if per_node[0] != per_node[1]:
        return False
    a, b = machine.devices[better[0]], machine.devices[worse[0]]
    if a.memory < b.memory or a.memory_bandwidth < b.memory_bandwidth:
        return False
    if any(a.peak(dtype) < b.peak(dtype) for dtype in set(a.flops) | set(b.flops)):
        return False
    na, nb = machine.node(machine.node_of[better[0]]), machine.node(machine.node_of[worse[0]])
    if na.link.bandwidth < nb.link.bandwidth or na.link.latency > nb.link.latency:
        return False
    if nb.network is None:
        return True
    if na.network is None:
        return per_node[0][0] == len(better)  # one node: no network used
    return na.network.bandwidth * na.nics >= nb.network.bandwidth * nb.nics and na.network.latency <= nb.network.latency


def fastest_device(machine: Machine) -> int:
    """The machine's fastest device (peak float32 FLOP/s, then memory bandwidth; the first of equals)."""
    kinds: dict[str, int] = {}
    for device, spec in enumerate(machine.devices):
        kinds.setdefault(spec.name, device)
    return max(
        kinds.values(), key=lambda d: (machine.devices[d].peak("float32"), machine.devices[d].memory_bandwidth, -d)
    )
