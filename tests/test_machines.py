"""Machine descriptions: presets, files, --nodes/--interconnect, heterogeneous machines, and errors that name
the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_cli

from unity_eq import optimize
from unity_eq.cost import CostModel, OpInstance
from unity_eq.errors import MachineError
from unity_eq.ir import Mesh
from unity_eq.machine import INTERCONNECTS, load_machine, preset_names

ROOT = Path(__file__).resolve().parents[1]
MACHINE_FILES = sorted((ROOT / "examples" / "machines").glob("*.toml"))

GOOD = """
name = "box"
[devices.G]
peak_tflops = { float32 = 10, float16 = 100 }
memory_bandwidth_gbs = 1000
memory_gib = 16
[links.fast]
bandwidth_gbs = 100
latency_us = 2
[links.net]
bandwidth_gbs = 10
latency_us = 5
[[nodes]]
devices = { G = 4 }
link = "fast"
network = "net"
count = 2
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "machine.toml"
    path.write_text(text)
    return path


def test_the_presets_the_issue_asks_for() -> None:
    """Links are the all-reduce bus bandwidths of NVIDIA's nccl-tests slide (GTC24 S62129: NVLink3 232,
    NVLink4 370, PCIe Gen4 24 GB/s), not the line rates (300, 450, 31.5 GB/s)."""
    assert {"a100x8", "h100x8", "pcie-a100x8"} <= set(preset_names())
    a100 = load_machine("a100x8")
    assert a100.device_count == 8 and a100.node_count == 1
    assert a100.devices[0].memory == 80 * 2**30 and a100.intra_link.bandwidth == 232e9
    h100 = load_machine("h100x8")
    assert h100.devices[0].peak("float16") == 989e12 and h100.intra_link.name == "nvlink4"
    assert h100.intra_link.bandwidth == 370e9
    pcie = load_machine("pcie-a100x8")
    assert pcie.intra_link.bandwidth == 24e9 and pcie.intra_link.name == "pcie4"


# per NIC: 24 and 48 GB/s from NVIDIA's slide (200Gb / 400Gb RDMA), 12 GB/s per 100G NIC (nccl-tests#119)
@pytest.mark.parametrize(("interconnect", "gbs"), [("ib100", 12.0), ("ib200", 24.0), ("ib400", 48.0), ("eth100", 12.0)])
def test_nodes_and_interconnect_repeat_a_preset(interconnect: str, gbs: float) -> None:
    machine = load_machine("h100x8", nodes=4, interconnect=interconnect)
    assert machine.device_count == 32 and machine.node_count == 4
    assert machine.node_of == tuple(i // 8 for i in range(32))
    node = machine.node(3)
    assert node.network is not None and node.network.bandwidth == gbs * 1e9 and node.nics == 8
    assert machine.name == f"4xh100x8 ({interconnect})"


def _link_table() -> dict[str, tuple[float, float]]:
    """docs/machines.md "Link bandwidths": link name -> (line rate, achievable bus bandwidth) in GB/s."""
    text = (ROOT / "docs" / "machines.md").read_text().split("## Link bandwidths", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "**" in line]
    table = {}
    for link, line_rate, achievable, source in rows:
        assert source.strip(" |"), f"no source for {link}"
        name = re.search(r"\(`([\w-]+)`", link)
        assert name, link
        table[name[1]] = (float(line_rate.split()[0]), float(achievable.strip("* ").split()[0]))
    return table


def test_preset_links_are_the_documented_bus_bandwidths_with_their_source() -> None:
    """Every preset link and every --interconnect network has a row in docs/machines.md's table whose achievable
    figure is what the code uses and is below the line rate; each link of a preset TOML has its source in a
    comment just above it that names the same line rate."""
    table = _link_table()
    for name in preset_names():
        machine = load_machine(name)
        links = {machine.node(0).link} | {machine.node(0).network} - {None}
        for link in links:
            assert link is not None and link.name in table, f"{name}: {link} has no row in docs/machines.md"
            line_rate, achievable = table[link.name]
            assert link.bandwidth == achievable * 1e9 and achievable < line_rate
        text = (ROOT / "unity_eq" / "machines" / f"{name}.toml").read_text().splitlines()
        for i, line in enumerate(text):
            if line.startswith("[links."):
                link_name = line[len("[links.") : -1]
                comment = text[i - 1]
                assert comment.startswith("# line rate") and "nccl" in comment.lower(), (name, comment)
                assert f"line rate {table[link_name][0]:g} GB/s" in comment, (name, comment)
    for interconnect, (gbs, _latency) in INTERCONNECTS.items():
        assert table[interconnect][1] == gbs < table[interconnect][0]


def test_devices_alone_is_the_a100_node() -> None:
    from unity_eq.machine import default_machine

    by_devices, preset = default_machine(8), load_machine("a100x8")
    assert by_devices.intra_link.bandwidth == preset.intra_link.bandwidth
    assert by_devices.intra_link.latency == pytest.approx(preset.intra_link.latency)
    assert by_devices.devices[0].flops == preset.devices[0].flops


@pytest.mark.parametrize("path", MACHINE_FILES, ids=lambda p: p.stem)
def test_example_machine_files_load(path: Path) -> None:
    machine = load_machine(path)
    assert machine.device_count >= 2 and machine.source == str(path)


def test_a_file_with_count_makes_nodes(tmp_path: Path) -> None:
    machine = load_machine(_write(tmp_path, GOOD))
    assert machine.device_count == 8 and machine.node_count == 2
    assert [n.name for n in machine.nodes] == ["node0", "node1"]
    assert machine.node(1).nics == 4  # one NIC per device by default


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (("memory_gib = 16", "memory_gib = 'sixteen'"), ["devices.G.memory_gib", "positive number", "'sixteen'"]),
        (("memory_gib = 16", "memory_gb = 16"), ["unknown field `devices.G.memory_gb`", "memory_gib"]),
        (("memory_gib = 16\n", ""), ["missing field `devices.G.memory_gib`"]),
        (('link = "fast"', 'link = "slow"'), ["nodes[0].link", "'slow'", "defined: fast, net"]),
        (("devices = { G = 4 }", "devices = { H = 4 }"), ["nodes[0].devices.H", "defined: G"]),
        (("float16 = 100", "float17 = 100"), ["peak_tflops.float17", "float16"]),
        (("latency_us = 2", "latency_us = -2"), ["links.fast.latency_us", "-2"]),
        (("count = 2", "count = 0"), ["nodes[0].count", "positive integer"]),
        (('network = "net"\n', ""), ["nodes[0].network", "2 nodes"]),
        (('name = "box"', 'name = "box"\nspeed = 3'), ["unknown field `speed`"]),
        (("[[nodes]]", "[nodes]"), ["missing field `nodes`"]),
        (("memory_gib = 16", "memory_gib = 16 16"), ["not valid TOML"]),
    ],
)
def test_a_wrong_field_is_named(tmp_path: Path, edit: tuple[str, str], needles: list[str]) -> None:
    assert edit[0] in GOOD
    path = _write(tmp_path, GOOD.replace(edit[0], edit[1], 1))
    with pytest.raises(MachineError) as info:
        load_machine(path)
    message = str(info.value)
    assert str(path) in message or "`--" in message
    for needle in needles:
        assert needle in message, message


def test_unknown_preset_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MachineError, match="h100x8"):
        load_machine("h200x8")
    with pytest.raises(MachineError, match="not found"):
        load_machine(tmp_path / "nope.toml")
    with pytest.raises(MachineError, match="`--interconnect`"):
        load_machine("h100x8", nodes=2, interconnect="ib800")
    with pytest.raises(MachineError, match="one node"):
        load_machine(ROOT / "examples" / "machines" / "mixed.toml", nodes=2)


def test_cli_machine_error_is_one_line(tmp_path: Path, examples: Path) -> None:
    path = _write(tmp_path, GOOD.replace("memory_gib = 16", "memory_gib = -1"))
    proc = run_cli("optimize", str(examples / "mlp.onnx"), "--machine", str(path), "-q")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "devices.G.memory_gib" in line and str(path) in line


# ----------------------------------------------------------------------------------------------------------
# Heterogeneous machines


def test_heterogeneous_machine_costs_at_the_slowest_device_and_link() -> None:
    machine = load_machine(ROOT / "examples" / "machines" / "mixed.toml")
    assert machine.device_count == 8 and [d.name for d in machine.devices[3:5]] == ["H100-SXM-80G", "A100-PCIe-40G"]
    everything = CostModel(machine, Mesh(("x",), (8,)))
    hopper = CostModel(machine, Mesh(("x",), (4,), (0, 1, 2, 3)))
    ampere = CostModel(machine, Mesh(("x",), (4,), (4, 5, 6, 7)))
    op = OpInstance("MatMul", ((512, 4096), (4096, 4096)), 0.0, (512, 4096), 0.0, "float16")
    # compute: SPMD waits for the slowest device (the A100)
    assert everything.compute(op).total == ampere.compute(op).total > hopper.compute(op).total
    # memory: the smallest device bounds every rank
    assert everything.memory_capacity() == pytest.approx(40 * 2**30 * 0.9)
    assert hopper.memory_capacity() == pytest.approx(80 * 2**30 * 0.9)
    # links: inside the A100 node, PCIe; across the nodes, the A100 node's one 25 GB/s NIC shared by 4 ranks
    assert ampere.axis_link("x").bandwidth == 24e9 and hopper.axis_link("x").bandwidth == 450e9
    (top,) = everything.group_topologies("x")
    assert (top.n, top.k, top.m) == (8, 4, 2)
    assert top.network is not None and top.network.bandwidth == pytest.approx(25e9 / 4)
    assert top.local is not None and top.local.bandwidth == 24e9  # the slower node link
    nbytes = 64 * 2**20
    expected = 2 * (3 / 4 * nbytes / 24e9 + 3 * 5e-6) + (2 * 1 / 2 * (nbytes / 4) / (25e9 / 4) + 2 * 5e-6)
    assert everything.all_reduce("x", nbytes) == pytest.approx(expected)


def test_heterogeneous_machine_optimizes(examples: Path) -> None:
    result = optimize(examples / "mlp.onnx", machine=ROOT / "examples" / "machines" / "mixed.toml")
    plan = result.plan
    assert plan.validate() == []
    assert 0 < plan.cost.total < result.plan.report.baselines["one_device"].total_s * 10
    # the plan leaves the A100 node idle (tests/test_progress.py): its capacity is the H100s'
    assert plan.mesh.devices == (0, 1, 2, 3)
    assert plan.report.memory is not None
    assert plan.report.memory.capacity_bytes == pytest.approx(80 * 2**30 * 0.9)


def test_device_groups_of_homogeneous_and_mixed_machines(examples: Path) -> None:
    """A homogeneous machine is one group and its candidate meshes are all over every device (its plans
    are the ones it got before plans on part of a machine); mixed.toml is two groups, the H100 node
    dominating the A100 node (not the other way), whose meshes are one skipped entry."""
    from unity_eq.frontends.onnx import load_onnx
    from unity_eq.search.meshes import _dominates, candidate_meshes, device_groups

    graph = load_onnx(examples / "mlp.onnx")
    for name in ("dgx-h100x2.toml", "workstation.toml"):
        machine = load_machine(ROOT / "examples" / "machines" / name)
        assert device_groups(machine) == [tuple(range(machine.device_count))]
        assert all(t.mesh.devices == tuple(range(machine.device_count)) for t in candidate_meshes(machine, graph))
    mixed = load_machine(ROOT / "examples" / "machines" / "mixed.toml")
    hopper, ampere = device_groups(mixed)
    assert (hopper, ampere) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert _dominates(mixed, hopper, ampere) and not _dominates(mixed, ampere, hopper)
    trials = candidate_meshes(mixed, graph)
    scoped = [t for t in trials if t.scope]
    assert [t.label for t in scoped if t.mesh.devices == ampere] == ["x=4 on devices 4-7"]
    assert {t.label for t in scoped if t.status == "pending"} == {"x=4 on devices 0-3", "x=2,y=2 on devices 0-3"}
