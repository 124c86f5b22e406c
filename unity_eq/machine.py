"""Machines: devices, links and nodes (:class:`Machine`, whose types are :mod:`unity_eq.machine_spec`'s and are
re-exported here), and their descriptions in TOML files and presets.

A machine file names device kinds, links, and nodes made of devices joined by links (docs/machines.md
documents every field and its unit). Presets are such files shipped in ``unity_eq/machines/``; ``--nodes N``
repeats a machine's node N times and ``--interconnect NAME`` sets the network between nodes:

    load_machine("h100x8")                                  # one node of 8 H100 on NVLink
    load_machine("h100x8", nodes=4, interconnect="ib200")   # 4 such nodes on 200 Gb/s InfiniBand
    load_machine("examples/machines/mixed.toml")            # a file

Every problem with a description raises :class:`~unity_eq.errors.MachineError` naming the file and the field.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unity_eq.errors import MachineError, OptionError
from unity_eq.machine_spec import (
    A100_80G,
    MAX_DEVICES,
    NVLINK3,
    DeviceSpec,
    GroupTopology,
    LinkSpec,
    Machine,
    NodeSpec,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "DTYPES",
    "INTERCONNECTS",
    "MAX_DEVICES",
    "DeviceSpec",
    "GroupTopology",
    "LinkSpec",
    "Machine",
    "NodeSpec",
    "check_device_count",
    "default_machine",
    "load_machine",
    "machine_from_toml",
    "preset_names",
    "presets_dir",
]


def check_device_count(devices: int, what: str) -> None:
    """Refuse more than MAX_DEVICES devices before building anything of that size."""
    if devices > MAX_DEVICES:
        raise OptionError(
            f"{what}: expected at most {MAX_DEVICES} devices, got {devices}. A plan holds one ONNX file per device; "
            "plan one replica of the model (e.g. `--devices 1024`) and run copies of it data parallel."
        )


#: The presets' efficiencies per op class (docs/machines.md, "Efficiency per op class", gives the measurement):
#: GEMMs and streaming kernels reach 0.75 of peak (GEMMs measured 0.99× the prediction at 0.75 on an H200);
#: layout copies (Transpose, Split) ran 1.7-2.1× slower than predicted at 0.75, so 0.75 / 1.9 ≈ 0.40.
PRESET_EFFICIENCIES: Mapping[str, float] = {"gemm": 0.75, "memory": 0.75, "layout": 0.40}


def default_machine(devices: int) -> Machine:
    """``--devices N``: N A100-80G GPUs in one node on NVLink, with the presets' efficiencies."""
    check_device_count(devices, "`--devices`")
    return Machine(
        f"{devices}xA100-SXM-80G",
        (A100_80G,) * devices,
        (0,) * devices,
        NVLINK3,
        source="--devices",
        efficiencies=dict(PRESET_EFFICIENCIES),
    )


#: Networks for ``--interconnect``: one NIC's bandwidth (GB/s, one direction) and latency (µs). The bandwidth is
#: the bus bandwidth NCCL's all-reduce reaches per NIC on large messages (nccl-tests), not the line rate: the ring
#: formulas of :mod:`unity_eq.cost.collectives` move bytes at bus bandwidth. Sources: docs/machines.md.
INTERCONNECTS: dict[str, tuple[float, float]] = {
    "ib100": (12.0, 5.0),  # EDR InfiniBand, 100 Gb/s = 12.5 GB/s line; 12: S. Jeaugey (NVIDIA), nccl-tests#119
    "ib200": (24.0, 5.0),  # HDR InfiniBand, 200 Gb/s = 25 GB/s line; 24: NVIDIA GTC24 S62129 (200Gb RDMA)
    "ib400": (48.0, 5.0),  # NDR InfiniBand, 400 Gb/s = 50 GB/s line; 48: NVIDIA GTC24 S62129 (400Gb RDMA)
    "eth100": (12.0, 10.0),  # 100 Gb Ethernet with RoCE, 12.5 GB/s line; 12: as ib100 (RDMA rows are IB/RoCE)
}

#: dtype names accepted in ``peak_tflops`` (numpy's names, plus bfloat16 and float8).
DTYPES = ("float64", "float32", "float16", "bfloat16", "float8", "int64", "int32", "int16", "int8", "uint8")

_TOP = {"name", "description", "launch_overhead_us", "efficiency", "memory_fraction", "devices", "links", "nodes"}
_DEVICE = {"peak_tflops", "memory_bandwidth_gbs", "memory_gib", "efficiency"}
#: op classes an ``efficiency`` table may name (unity_eq.ops.family.COMPUTE_CLASSES)
_CLASSES = ("gemm", "memory", "layout", "attention")
_LINK = {"bandwidth_gbs", "latency_us"}
_NODE = {"name", "devices", "link", "network", "nics", "count"}


def presets_dir() -> Path:
    return Path(__file__).resolve().parent / "machines"


def preset_names() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.toml"))


def load_machine(spec: str | Path, nodes: int | None = None, interconnect: str | None = None) -> Machine:
    """A preset name or a TOML file; ``nodes`` and ``interconnect`` reshape a machine with one kind of node."""
    text_spec = str(spec)
    preset = presets_dir() / f"{text_spec}.toml"
    path = Path(text_spec)
    if not text_spec.endswith(".toml") and preset.is_file():
        source, text = text_spec, preset.read_text()
    elif path.is_file():
        source = str(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise MachineError(f"{path}: unreadable machine file ({exc}).") from None
    elif path.suffix == ".toml" or "/" in text_spec:
        raise MachineError(
            f"{path}: machine file not found. Pass a TOML file or a preset ({', '.join(preset_names())})."
        )
    else:
        raise MachineError(
            f"`--machine`: expected a TOML file or a preset ({', '.join(preset_names())}), got {text_spec!r}."
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MachineError(f"{source}: not valid TOML ({exc}).") from None
    return machine_from_toml(data, source, nodes=nodes, interconnect=interconnect)


# ----------------------------------------------------------------------------------------------------------
# Validation helpers: each names the field in the error


@dataclass
class _Reader:
    source: str

    def fail(self, field: str, message: str) -> MachineError:
        return MachineError(f"{self.source}: field `{field}`: {message}")

    def table(self, value: Any, field: str, allowed: set[str] | None = None) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, f"expected a table, got {type(value).__name__} {value!r}.")
        if allowed is not None:
            unknown = sorted(set(value) - allowed)
            if unknown:
                prefix = f"{field}." if field else ""
                raise MachineError(
                    f"{self.source}: unknown field `{prefix}{unknown[0]}`; expected one of "
                    f"{', '.join(sorted(allowed))}. See docs/machines.md."
                )
        return value

    def value(self, table: Mapping[str, Any], key: str, field: str, default: Any, ok: Callable[[Any], bool]) -> Any:
        """``table[key]``, or ``default`` when absent (absent without a default: a missing field); None when
        present but ``ok`` refuses it (the caller says what it expected)."""
        if key not in table:
            if default is None:
                raise MachineError(f"{self.source}: missing field `{field}`. See docs/machines.md.")
            return default
        return table[key] if ok(table[key]) else None

    def number(self, table: Mapping[str, Any], key: str, field: str, default: float | None = None) -> float:
        value = self.value(table, key, field, default, _positive_number)
        if value is None:
            raise self.fail(field, f"expected a positive number, got {table[key]!r}.")
        return value if key not in table else float(value)

    def fraction(self, table: Mapping[str, Any], key: str, default: float, field: str | None = None) -> float:
        name = field or key
        value = self.number(table, key, name, default)
        if value > 1:
            raise self.fail(name, f"expected a fraction in (0, 1], got {value!r}.")
        return value

    def integer(self, table: Mapping[str, Any], key: str, field: str, default: int | None = None) -> int:
        value = self.value(table, key, field, default, _positive_integer)
        if value is None:
            raise self.fail(field, f"expected a positive integer, got {table[key]!r}.")
        return int(value)

    def string(self, table: Mapping[str, Any], key: str, field: str, default: str | None = None) -> str:
        value = self.value(table, key, field, default, lambda v: isinstance(v, str) and bool(v))
        if value is None:
            raise self.fail(field, f"expected a non-empty string, got {table[key]!r}.")
        return str(value)


def _positive_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0 and value != float("inf")


def _positive_integer(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _device(r: _Reader, name: str, raw: Any) -> DeviceSpec:
    field = f"devices.{name}"
    table = r.table(raw, field, _DEVICE)
    peaks = r.table(table.get("peak_tflops"), f"{field}.peak_tflops") if "peak_tflops" in table else None
    if not peaks:
        raise MachineError(
            f"{r.source}: missing field `{field}.peak_tflops` (TFLOP/s per dtype, e.g. {{ float32 = 67 }})."
        )
    flops: dict[str, float] = {}
    for dtype in peaks:
        if dtype not in DTYPES:
            raise MachineError(
                f"{r.source}: unknown dtype `{field}.peak_tflops.{dtype}`; expected one of {', '.join(DTYPES)}."
            )
        flops[dtype] = r.number(peaks, dtype, f"{field}.peak_tflops.{dtype}") * 1e12
    return DeviceSpec(
        name,
        flops,
        r.number(table, "memory_bandwidth_gbs", f"{field}.memory_bandwidth_gbs") * 1e9,
        r.number(table, "memory_gib", f"{field}.memory_gib") * 2**30,
        _efficiencies(r, table, f"{field}.efficiency", number_is_every_class=True),
    )


def _efficiencies(
    r: _Reader, table: Mapping[str, Any], field: str, *, number_is_every_class: bool = False
) -> dict[str, float]:
    """An ``efficiency`` field given as a table of op classes (``{ gemm = 0.75, layout = 0.4 }``): its values.
    A number is every class's value for a device kind; at the top it is the plain ``efficiency`` (no per-class
    values)."""
    raw = table.get("efficiency")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        if not number_is_every_class:
            return {}
        value = r.fraction(table, "efficiency", 1.0, field)
        return dict.fromkeys(_CLASSES, value)
    classes = r.table(raw, field, set(_CLASSES))
    return {name: r.fraction(classes, name, 1.0, f"{field}.{name}") for name in classes}


def _plain_efficiency(r: _Reader, table: Mapping[str, Any], field: str, default: float) -> float:
    """An ``efficiency`` number, or for a table its ``memory`` value (the plain efficiency of what it leaves out),
    for devices: the default when absent."""
    raw = table.get("efficiency")
    if isinstance(raw, dict):
        return r.fraction(raw, "memory", default, f"{field}.memory") if "memory" in raw else default
    return r.fraction(table, "efficiency", default)


def _link(r: _Reader, name: str, raw: Any) -> LinkSpec:
    field = f"links.{name}"
    table = r.table(raw, field, _LINK)
    return LinkSpec(
        r.number(table, "bandwidth_gbs", f"{field}.bandwidth_gbs") * 1e9,
        r.number(table, "latency_us", f"{field}.latency_us") * 1e-6,
        name,
    )


def _ref(r: _Reader, table: Mapping[str, Any], key: str, field: str, known: Mapping[str, Any], what: str) -> Any:
    name = r.string(table, key, field)
    if name not in known:
        defined = ", ".join(sorted(known)) or "none"
        raise r.fail(field, f"{name!r} is not a {what} (defined: {defined}).")
    return known[name]


def machine_from_toml(
    data: Mapping[str, Any],
    source: str = "<machine>",
    *,
    nodes: int | None = None,
    interconnect: str | None = None,
) -> Machine:
    """Build a Machine from parsed TOML (see docs/machines.md); ``nodes``/``interconnect`` as in load_machine."""
    r = _Reader(source)
    top = r.table(data, "", _TOP)
    name = r.string(top, "name", "name")
    if "description" in top:
        r.string(top, "description", "description")
    raw_devices = r.table(top.get("devices", {}), "devices")
    if not raw_devices:
        raise MachineError(f"{source}: missing field `devices` (at least one [devices.<kind>] table).")
    kinds = {k: _device(r, k, v) for k, v in raw_devices.items()}
    links = {k: _link(r, k, v) for k, v in r.table(top.get("links", {}), "links").items()}
    raw_nodes = top.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise MachineError(f"{source}: missing field `nodes` (at least one [[nodes]] table).")

    network_override = None
    if interconnect is not None:
        if interconnect not in INTERCONNECTS:
            raise MachineError(f"`--interconnect`: expected one of {', '.join(INTERCONNECTS)}, got {interconnect!r}.")
        bandwidth, latency = INTERCONNECTS[interconnect]
        network_override = LinkSpec(bandwidth * 1e9, latency * 1e-6, interconnect)
    if (nodes is not None or interconnect is not None) and (
        len(raw_nodes) != 1 or (isinstance(raw_nodes[0], dict) and raw_nodes[0].get("count", 1) != 1)
    ):
        raise MachineError(
            f"{source}: `--nodes` and `--interconnect` repeat a machine made of one node; this one describes "
            f"{len(raw_nodes)} [[nodes]] entries. Describe the nodes in the file instead."
        )
    if nodes is not None and nodes < 1:
        raise MachineError(f"`--nodes`: expected a positive integer, got {nodes}.")

    devices: list[DeviceSpec] = []
    node_of: list[int] = []
    node_specs: list[NodeSpec] = []
    pending_network: list[tuple[int, str]] = []
    for i, raw in enumerate(raw_nodes):
        field = f"nodes[{i}]"
        table = r.table(raw, field, _NODE)
        members = r.table(table.get("devices"), f"{field}.devices") if "devices" in table else None
        if not members:
            raise MachineError(f"{source}: missing field `{field}.devices` (e.g. devices = {{ H100 = 8 }}).")
        node_devices: list[DeviceSpec] = []
        for kind in members:
            if kind not in kinds:
                raise r.fail(f"{field}.devices.{kind}", f"{kind!r} is not a device kind (defined: {', '.join(kinds)}).")
            node_devices += [kinds[kind]] * r.integer(members, kind, f"{field}.devices.{kind}")
        if "link" in table:
            link = _ref(r, table, "link", f"{field}.link", links, "link of [links]")
        elif len(node_devices) == 1:
            link = LinkSpec(float("inf"), 0.0, "none")
        else:
            raise MachineError(f"{source}: missing field `{field}.link` (the link between the node's devices).")
        network = None
        if network_override is not None:
            network = network_override
        elif "network" in table:
            network = _ref(r, table, "network", f"{field}.network", links, "link of [links]")
        nics = r.integer(table, "nics", f"{field}.nics", len(node_devices))
        count = nodes if nodes is not None else r.integer(table, "count", f"{field}.count", 1)
        check_device_count(len(devices) + count * len(node_devices), f"{source}" + (" with `--nodes`" if nodes else ""))
        base = r.string(table, "name", f"{field}.name", f"node{i}" if len(raw_nodes) > 1 else "node")
        for c in range(count):
            index = len(node_specs)
            node_specs.append(NodeSpec(f"{base}{c}" if count > 1 else base, link, network, nics))
            devices += node_devices
            node_of += [index] * len(node_devices)
            if network is None:
                pending_network.append((index, field))
    if len(node_specs) > 1 and pending_network:
        _, field = pending_network[0]
        raise MachineError(
            f"{source}: missing field `{field}.network`: the machine has {len(node_specs)} nodes and this one has no "
            "link to the others. Name a link of [links] (or pass `--interconnect`)."
        )
    if len(node_specs) > 1:
        suffix = f" ({interconnect})" if interconnect else ""
        name = f"{len(node_specs)}x{name}{suffix}" if nodes is not None else name
    intra = min((n.link for n in node_specs), key=lambda link: link.bandwidth)
    inter = min((n.network for n in node_specs if n.network is not None), key=lambda link: link.bandwidth, default=None)
    return Machine(
        name=name,
        devices=tuple(devices),
        node_of=tuple(node_of),
        intra_link=intra,
        inter_link=inter,
        launch_overhead=r.number(top, "launch_overhead_us", "launch_overhead_us", 5.0) * 1e-6,
        efficiency=_plain_efficiency(r, top, "efficiency", 0.75),
        nodes=tuple(node_specs),
        memory_fraction=r.fraction(top, "memory_fraction", 0.9),
        source=source,
        efficiencies=_efficiencies(r, top, "efficiency"),
    )
