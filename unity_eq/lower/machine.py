"""plan.json's ``machine``: the device kinds, nodes, links and per-axis link figures the plan was priced on,
apart from the plan's own records (lower/record.py) because it describes the machine file, not the plan."""

from __future__ import annotations

import math

from unity_eq.plan import Plan
from unity_eq.planfile import DeviceKindRecord, LinkRecord, MachineRecord, NodeRecord

__all__ = ["machine_record"]


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def machine_record(plan: Plan) -> MachineRecord:
    """The machine as plan.json records it: device kinds, nodes and links (SI units: FLOP/s, bytes/s, s)."""
    from unity_eq.cost import CostModel
    from unity_eq.planfile.axes import axis_info

    machine = plan.machine
    kinds = {}
    for device in machine.devices:
        kinds[device.name] = DeviceKindRecord(
            peak_flops=dict(device.flops),
            memory_bandwidth_bytes_s=device.memory_bandwidth,
            memory_bytes=device.memory,
        )
    nodes = []
    for index in sorted(set(machine.node_of)):
        node = machine.node(index)
        network = node.network
        nodes.append(
            NodeRecord(
                name=node.name,
                devices=tuple(d for d, n in enumerate(machine.node_of) if n == index),
                link=LinkRecord(
                    name=node.link.name, bandwidth_bytes_s=_finite(node.link.bandwidth), latency_s=node.link.latency
                ),
                network=None
                if network is None
                else LinkRecord(name=network.name, bandwidth_bytes_s=network.bandwidth, latency_s=network.latency),
                nics=node.nics,
            )
        )
    model = CostModel(machine, plan.mesh, plan.objective)
    return MachineRecord(
        name=machine.name,
        source=machine.source,
        devices=machine.device_count,
        nodes=machine.node_count,
        device_kinds=kinds,
        node_list=tuple(nodes),
        launch_overhead_s=machine.launch_overhead,
        efficiency=machine.efficiency,
        memory_fraction=machine.memory_fraction,
        mesh_axes=tuple(axis_info(model, a) for a in plan.mesh.axes),
    )
