"""What the user asked ``optimize`` for, checked once: :class:`OptimizeRequest`, built by :func:`build_request`.

The CLI and the API both build one request; every check of an option (and of options that do not go together)
happens here, before any work starts, so the stages of the driver take a valid request and never re-check it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType

from unity_eq.cost import OBJECTIVES, TRAINING, Objective
from unity_eq.egraph import Limits
from unity_eq.errors import OptionError, RuleError
from unity_eq.extract import ExtractionMethod
from unity_eq.files import check_output_dir
from unity_eq.ir import Mesh
from unity_eq.machine import Machine, default_machine
from unity_eq.profile_table import ProfileTable
from unity_eq.rulefile.manifest import RuleFile, default_rule_files, load_rule_files, rules_dir
from unity_eq.stages.config import StageFilter

__all__ = ["OptimizeRequest", "Planner", "build_request", "load_rules", "machine_for"]

BLOCK_MODES = ("auto", "on", "off")


class Planner(StrEnum):
    """Which search a request runs: the SPMD search, the stage search alone (``--pipeline``), or both weighed
    on a training step (``--objective training``, unity_eq.driver.training)."""

    SPMD = "spmd"
    PIPELINE = "pipeline"
    TRAINING = "training"


@dataclass(frozen=True)
class OptimizeRequest:
    """A checked ``optimize`` request: every field valid, and valid together (:func:`build_request`)."""

    planner: Planner
    machine: Machine
    objective: Objective
    output_dir: Path | None = None
    plan_only: bool = False
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    limits: Limits | None = None
    rule_files: tuple[Path, ...] | None = None  # replaces the default manifest
    generated_rules: bool = True
    mesh: Mesh | None = None  # forced (SPMD search only)
    max_axes: int = 3
    profile: Path | ProfileTable | None = None
    blocks: str = "auto"
    extractor: ExtractionMethod = ExtractionMethod.GREEDY
    ilp_time_limit: float = 60.0
    weight_inputs: tuple[str, ...] = ()
    #: ``--parameters``: initializer -> the source model's parameter(s) it holds (``Graph.with_parameters``);
    #: None: judged by dtype and rank (``ir.is_parameter_type``)
    parameters: Mapping[str, tuple[str, ...]] | None = None
    batch: int | None = None  # samples per step (training search, stage search)
    only: StageFilter | None = None  # the stage search's forced stages, tensor group, microbatches

    @property
    def lowers(self) -> bool:
        """Whether device files are written (an output folder, not ``--plan-only``)."""
        return self.output_dir is not None and not self.plan_only


def build_request(
    *,
    planner: Planner | None = None,
    pipeline: bool = False,
    devices: int | None = None,
    machine: Machine | str | Path | None = None,
    nodes: int | None = None,
    interconnect: str | None = None,
    output_dir: str | Path | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    objective: str = "inference",
    mesh: str | Mesh | None = None,
    max_axes: int = 3,
    limits: Limits | None = None,
    rule_files: Sequence[Path] | None = None,
    generated_rules: bool = True,
    profile: str | Path | ProfileTable | None = None,
    blocks: str = "auto",
    extractor: str = "greedy",
    ilp_time_limit: float = 60.0,
    plan_only: bool = False,
    weight_inputs: Sequence[str] = (),
    parameters: str | Path | Mapping[str, Sequence[str]] | None = None,
    batch: int | None = None,
    stages: int | None = None,
    tensor: int | None = None,
    microbatches: int | None = None,
) -> OptimizeRequest:
    """Check the options (OptionError, MachineError, RuleError, PlanError on the first one wrong) and return the
    request. ``planner`` None picks it as the CLI does: ``pipeline`` → the stage search alone; ``objective``
    training without an option that plans one SPMD plan of the model as it is (``mesh``, ``profile``,
    ``weight_inputs``) → the training search; otherwise the SPMD search. ``machine`` is a Machine, a preset or
    a TOML file (``nodes``/``interconnect`` reshape it); ``devices`` alone means that many A100-80G."""
    spmd_only = [
        name for name, given in (("--mesh", mesh), ("--profile", profile), ("--weight-input", weight_inputs)) if given
    ]
    if planner is None:
        if pipeline:
            planner = Planner.PIPELINE
        elif objective == "training" and not spmd_only:
            planner = Planner.TRAINING
        else:
            planner = Planner.SPMD
    _check_combinations(planner, objective, spmd_only, batch, (stages, tensor, microbatches), extractor, blocks)
    chosen_machine = machine_for(devices, machine, nodes, interconnect)
    if objective not in OBJECTIVES:
        raise OptionError(f"`--objective`: expected inference or training, got {objective!r}.")
    method = ExtractionMethod.parse(extractor)
    if planner is not Planner.PIPELINE:  # the stage search has no mesh search, ILP or blocks of its own
        _check_spmd_options(ilp_time_limit, max_axes, blocks)
    if batch is not None and batch < 1:
        raise OptionError(f"`--batch` must be at least 1, got {batch}.")
    for name, value in (("--stages", stages), ("--tensor", tensor), ("--microbatches", microbatches)):
        if value is not None and value < 1:
            raise OptionError(f"`{name}` must be at least 1, got {value}.")
    target = Path(output_dir) if output_dir is not None else None
    if target is not None:
        check_output_dir(target)
    forced = _forced_mesh(mesh, chosen_machine)
    if rule_files is not None:
        check_rule_files(rule_files)
    only = StageFilter(stages, tensor, microbatches) if (stages, tensor, microbatches) != (None, None, None) else None
    return OptimizeRequest(
        planner=planner,
        machine=chosen_machine,
        objective=TRAINING if planner is Planner.TRAINING else OBJECTIVES[objective],
        output_dir=target,
        plan_only=plan_only,
        input_shapes=MappingProxyType({n: tuple(s) for n, s in (input_shapes or {}).items()}),
        limits=limits,
        rule_files=tuple(Path(p) for p in rule_files) if rule_files is not None else None,
        generated_rules=generated_rules,
        mesh=forced,
        max_axes=max_axes,
        profile=Path(profile) if isinstance(profile, str) else profile,
        blocks=blocks,
        extractor=method,
        ilp_time_limit=ilp_time_limit,
        weight_inputs=tuple(weight_inputs),
        parameters=parameter_map(parameters),
        batch=batch,
        only=only,
    )


def parameter_map(given: str | Path | Mapping[str, Sequence[str]] | None) -> Mapping[str, tuple[str, ...]] | None:
    """``--parameters``: a JSON file holding either the source model's parameter names (a list, e.g.
    ``[n for n, _ in model.named_parameters()]``: each initializer of that name is that parameter) or an object
    from initializer to the parameter name(s) it holds (several: the exporter merged them); a mapping is taken
    as the object. None stays None."""
    if given is None:
        return None
    raw: object = given
    if isinstance(given, str | Path):
        try:
            raw = json.loads(Path(given).read_text())
        except OSError as exc:
            raise OptionError(f"`--parameters` {given}: cannot read it ({exc.strerror}).") from None
        except ValueError as exc:
            raise OptionError(f"`--parameters` {given}: not JSON ({exc}).") from None
    if isinstance(raw, list) and all(isinstance(n, str) for n in raw):
        return MappingProxyType({n: (n,) for n in raw})
    if isinstance(raw, Mapping):
        out: dict[str, tuple[str, ...]] = {}
        for key, value in raw.items():
            names = (value,) if isinstance(value, str) else value
            if (
                not isinstance(key, str)
                or not isinstance(names, list | tuple)
                or not names
                or not all(isinstance(n, str) for n in names)
            ):
                break
            out[key] = tuple(names)
        else:
            return MappingProxyType(out)
    where = given if isinstance(given, str | Path) else "(a mapping)"
    raise OptionError(
        f"`--parameters` {where}: expected a JSON list of parameter "
        'names or an object from initializer name to parameter name(s), e.g. {"ln.weight": ["h.0.ln.weight", '
        '"h.1.ln.weight"]}.'
    )


def _check_combinations(
    planner: Planner,
    objective: str,
    spmd_only: list[str],
    batch: int | None,
    staged: tuple[int | None, int | None, int | None],
    extractor: str,
    blocks: str,
) -> None:
    """Refuse options that do not go together, naming them."""
    if batch is not None and planner is Planner.SPMD and objective != "training":
        raise OptionError(
            "`--batch` sets the samples per step of training or of a pipeline: pass it with `--objective training` "
            "or `--pipeline`."
        )
    if batch is not None and planner is Planner.SPMD and spmd_only:
        raise OptionError(
            f"`--batch` plans a training step over SPMD plans and pipelines; `{spmd_only[0]}` plans one SPMD plan "
            "of the model as it is: give its batch with `--input-shape` instead."
        )
    given_staged = [n for n, v in zip(("--stages", "--tensor", "--microbatches"), staged, strict=True) if v is not None]
    if given_staged and planner is not Planner.PIPELINE:
        raise OptionError(f"`{given_staged[0]}` restricts the stage search: pass it with `--pipeline`.")
    if planner is Planner.PIPELINE:
        given = [*spmd_only, *(["--extractor ilp"] if extractor == "ilp" else [])]
        given += ["--blocks"] if blocks != "auto" else []
        order = ("--mesh", "--profile", "--extractor ilp", "--blocks", "--weight-input")
        names = [f"`{name}`" for name in order if name in given]
        if names:
            raise OptionError(f"{', '.join(names)} do not apply to `--pipeline` plans; leave them out.")


def _check_spmd_options(ilp_time_limit: float, max_axes: int, blocks: str) -> None:
    if ilp_time_limit <= 0:
        raise OptionError(f"`--ilp-time-limit` must be positive, got {ilp_time_limit}.")
    if not 1 <= max_axes <= 3:
        raise OptionError(f"`--max-axes`: expected 1, 2 or 3, got {max_axes}.")
    if blocks not in BLOCK_MODES:
        raise OptionError(f"`--blocks`: expected auto, on or off, got {blocks!r}.")


def _forced_mesh(mesh: str | Mesh | None, machine: Machine) -> Mesh | None:
    """``--mesh``: a Mesh over all the machine's devices, or None (search)."""
    if isinstance(mesh, Mesh):
        if mesh.size != machine.device_count:
            raise OptionError(
                f"`--mesh` {mesh} has {mesh.size} devices, the machine has {machine.device_count}. Make them agree."
            )
        return mesh
    return Mesh.parse(mesh, machine.device_count) if mesh is not None else None


def machine_for(
    devices: int | None,
    machine: Machine | str | Path | None,
    nodes: int | None = None,
    interconnect: str | None = None,
) -> Machine:
    """The machine of ``--devices``/``--machine``/``--nodes``/``--interconnect``, checked against each other."""
    if machine is not None and not isinstance(machine, Machine):
        from unity_eq.machine import load_machine

        machine = load_machine(machine, nodes=nodes, interconnect=interconnect)
    elif nodes is not None or interconnect is not None:
        raise OptionError(
            "`--nodes` and `--interconnect` need `--machine PRESET|FILE`, e.g. `--machine h100x8 --nodes 2`."
        )
    if machine is not None:
        if devices is not None and devices != machine.device_count:
            raise OptionError(
                f"`--devices` {devices} disagrees with the machine {machine.name!r} ({machine.device_count} devices). "
                "Pass one of them."
            )
        return machine
    if devices is None:
        raise OptionError("say how many devices: pass `--devices N` or `--machine FILE|PRESET`.")
    if devices < 1:
        raise OptionError(f"`--devices` must be at least 1, got {devices}.")
    return default_machine(devices)


def check_rule_files(paths: Sequence[Path]) -> None:
    """Parse and check the user's rule files once, before any search, with the parser `unity-eq verify` uses,
    then have egglog load them after the schema and analyses (as the engine workers will): an error is one
    ``file:line:col: …`` line here, not a failure inside every mesh's engine worker."""
    shipped = rules_dir().resolve()
    extra = [Path(p) for p in paths if not Path(p).resolve().is_relative_to(shipped)]
    if not extra:
        return
    from unity_eq.rulefile.load import display_path, load_program

    program, _ = load_program(extra, engine=False)  # raises RuleError on a syntax error, with file:line:col
    if program.errors:
        more = len(program.errors) - 1
        tail = f" ({more} more: run `unity-eq verify {' '.join(map(str, extra))}`)" if more else ""
        raise RuleError(program.errors[0] + tail)
    # then egglog itself loads exactly what every mesh's engine worker will load, once, here
    from unity_eq.rulefile.engine import engine_load_error

    files = load_rule_files([Path(p) for p in paths])
    error = engine_load_error([(display_path(f.path), f.text) for f in files])
    if error:
        raise RuleError(error)


def load_rules(request: OptimizeRequest) -> list[RuleFile]:
    """The rule files the request's searches load: its own list, or the default manifest."""
    files = list(request.rule_files) if request.rule_files is not None else default_rule_files(request.generated_rules)
    return load_rule_files(files)
