"""A plan directory as the runtime reads it: plan.json through planfile, the rank files and their identity.

Every check that a file belongs to this plan and this rank lives here, so the runners can assume a consistent
directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from unity_eq.dtypes import is_float, is_integral
from unity_eq.errors import OptionError, PlanError, RuntimeBackendError
from unity_eq.planfile import InputRecord, RunRecord, read_run_record
from unity_eq.planfile.pipeline import refuse_pipeline_plan


@dataclass
class PlanDir:
    """A plan directory and its plan.json as typed records (planfile.RunRecord)."""

    path: Path
    record: RunRecord

    @property
    def world_size(self) -> int:
        return self.record.world_size

    def model_path(self, rank: int) -> Path:
        return self.path / self.record.files[rank]

    @property
    def input_specs(self) -> Mapping[str, InputRecord]:
        return self.record.inputs

    @property
    def output_names(self) -> list[str]:
        return list(self.record.outputs)

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        for collective in self.record.collectives:
            if collective.axis == axis:
                for group in collective.groups:
                    if rank in group:
                        return group
        raise PlanError(f"{self.path}: rank {rank} is in no group of axis {axis}")


def load_plan_dir(path: str | Path, check_files: bool = True) -> PlanDir:
    """Read and sanity-check a plan directory written by ``unity-eq optimize``.

    ``check_files=False`` skips checking that every rank's ``device_<rank>.onnx`` exists: an MPI rank loads
    (and checks) only its own.
    """
    root = Path(path)
    if not root.exists():
        raise PlanError(f"{root}: plan directory not found. Create one with `unity-eq optimize MODEL -o {root}`.")
    if not root.is_dir():
        raise PlanError(f"{root}: not a directory. Pass the directory written by `unity-eq optimize`.")
    meta_path = root / "plan.json"
    if not meta_path.exists():
        raise PlanError(f"{root}: no plan.json. Pass the directory written by `unity-eq optimize`.")
    refuse_pipeline_plan(meta_path, "run` and `check")
    plan = PlanDir(root, read_run_record(meta_path))
    for rank in range(plan.world_size if check_files else 0):
        check_rank_file(plan, rank)
    return plan


def check_rank_file(plan: PlanDir, rank: int) -> None:
    if not plan.model_path(rank).exists():
        raise PlanError(f"{plan.path}: {plan.record.files[rank]} (rank {rank}) is missing. Re-run `unity-eq optimize`.")


def check_external_data(model: onnx.ModelProto, path: Path, plan_hash: str, rank: int) -> None:
    """Refuse external weights anywhere but the rank's own data file (``device_<rank>.onnx.data`` beside
    it, as ``optimize`` writes them): a plan must not make ``run`` read other files. A missing or short
    data file (a partial copy), or one whose header names another rank or plan (a swapped copy), is refused
    here too, with what to do, before onnxruntime reads it."""
    from onnx import external_data_helper

    from unity_eq.weightfile import read_identity

    own = f"{path.name}.data"
    size: int | None = None
    for tensor in model.graph.initializer:
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        if info.location != own:
            raise PlanError(
                f"{path}: weight {tensor.name!r} is stored in {info.location!r}; a device file keeps its weights "
                f"in itself or in {own!r} beside it. Re-run `unity-eq optimize`."
            )
        if size is None:
            if not (path.parent / own).is_file():
                raise PlanError(f"{path}: its weight file {own} is missing. Re-run `unity-eq optimize`.")
            size = (path.parent / own).stat().st_size
            _check_data_identity(path.parent / own, plan_hash, rank, read_identity(path.parent / own))
        end = int(info.offset or 0) + int(info.length or 0)
        if end > size:
            raise PlanError(
                f"{path}: its weight file {own} has {size} bytes, weight {tensor.name!r} needs {end}; the file "
                "is cut short (an incomplete copy?). Copy it again or re-run `unity-eq optimize`."
            )


def _check_data_identity(data: Path, plan_hash: str, rank: int, found: dict[str, str] | None) -> None:
    """Refuse a data file that is not this rank's of this plan (see ``weightfile.identity_header``)."""
    if found is None:
        raise PlanError(
            f"{data}: no unity-eq header; it was not written for this plan. Restore the plan's own file or "
            "re-run `unity-eq optimize`."
        )
    if found.get("plan_hash") != plan_hash:
        raise PlanError(
            f"{data}: holds the weights of another plan (plan hash {found.get('plan_hash', '?')[:12]}…, plan.json "
            f"has {plan_hash[:12]}…). Restore this plan's own file or re-run `unity-eq optimize`."
        )
    if found.get("rank") != str(rank):
        raise PlanError(
            f"{data}: holds the weights of rank {found.get('rank', '?')}, expected rank {rank}. The plan's files "
            "were swapped or renamed; restore them or re-run `unity-eq optimize`."
        )


def check_identity(plan: PlanDir, rank: int, model: onnx.ModelProto, path: Path) -> None:
    """Refuse a device file that belongs to another rank or another plan (its metadata_props, written by
    lowering, name its rank and the plan's hash; see ``unity_eq.lower.identity_props``)."""
    from unity_eq.weightfile import META_PLAN_HASH, META_RANK

    props = {p.key: p.value for p in model.metadata_props}
    expected_hash = plan.record.plan_hash
    if not expected_hash:
        raise PlanError(
            f"{plan.path / 'plan.json'}: no plan_hash (an older unity-eq wrote it). Re-run `unity-eq optimize`."
        )
    if META_RANK not in props or META_PLAN_HASH not in props:
        raise PlanError(
            f"{path}: no unity-eq identity in its metadata; it was not written for this plan. "
            "Re-run `unity-eq optimize`."
        )
    if props[META_PLAN_HASH] != expected_hash:
        raise PlanError(
            f"{path}: belongs to another plan (plan hash {props[META_PLAN_HASH][:12]}…, plan.json has "
            f"{expected_hash[:12]}…). Restore this plan's own file or re-run `unity-eq optimize`."
        )
    if props[META_RANK] != str(rank):
        raise PlanError(
            f"{path}: is the device file of rank {props[META_RANK]}, expected rank {rank}. "
            "The plan's files were swapped or renamed; restore them or re-run `unity-eq optimize`."
        )
    _check_collectives(plan, rank, props, path)


def _check_collectives(plan: PlanDir, rank: int, props: Mapping[str, str], path: Path) -> None:
    """plan.json's collectives are the ones lowering wrote into the device file (its metadata: kind, mesh
    axis, dim, this rank's peers, the tensors cut): a plan.json edited to run another collective, or one on
    another axis with groups to match, is refused before anything runs (issue 26's audit: such a plan ran with
    exit 0 and a wrong answer)."""
    from unity_eq.weightfile import META_COLLECTIVES

    if META_COLLECTIVES not in props:
        raise PlanError(f"{path}: its metadata names no collectives; re-run `unity-eq optimize`.")
    cuts = json.loads(props[META_COLLECTIVES])
    planned = plan.record.collectives
    if len(cuts) != len(planned):
        raise PlanError(
            f"{plan.path / 'plan.json'}: lists {len(planned)} collective(s), {path.name} was written with "
            f"{len(cuts)}; plan.json was edited. Restore it or re-run `unity-eq optimize`."
        )
    for cut, c in zip(cuts, planned, strict=True):
        peers = next((list(g) for g in c.groups if rank in g), [])
        dims = {name: c.dims().get(name) for name in ("dim", "split_dim", "concat_dim")}
        said = {"kind": c.kind, "axis": c.axis, **dims, "peers": peers, "src": c.src, "dst": c.dst}
        wrote = {key: cut.get(key) for key in said}
        if said != wrote:
            differ = ", ".join(f"{k} {said[k]!r} where it has {wrote[k]!r}" for k in said if said[k] != wrote[k])
            raise PlanError(
                f"{plan.path / 'plan.json'}: collectives[{c.id}] says {differ} in {path.name}; plan.json was "
                "edited. Restore it or re-run `unity-eq optimize`."
            )


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (model inputs), or an :class:`OptionError` saying what is wrong."""
    if not path.exists():
        raise OptionError(f"{path}: inputs file not found. Pass an .npz file with one array per model input.")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise OptionError(f"{path}: not a readable .npz file ({exc}). Save inputs with numpy.savez.") from None
    if not isinstance(data, np.lib.npyio.NpzFile):  # a .npy file holds one array with no input name
        raise OptionError(
            f"{path}: expected an .npz file with one named array per model input, got a single array (.npy). "
            "Save inputs with numpy.savez(path, NAME=array, ...)."
        )
    try:
        with data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError) as exc:
        raise OptionError(f"{path}: not a readable .npz file ({exc}). Save inputs with numpy.savez.") from None


def check_inputs(plan: PlanDir, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Match user inputs to the plan's model inputs by name, shape and dtype."""
    specs = plan.input_specs
    unknown = sorted(set(inputs) - set(specs))
    if unknown:
        raise RuntimeBackendError(f"inputs: unknown input {unknown[0]!r}; the model's inputs are {sorted(specs)}")
    out = {}
    for name, spec in specs.items():
        if name not in inputs:
            raise RuntimeBackendError(f"inputs: missing input {name!r} {spec.dtype}{list(spec.shape)}")
        array = np.asarray(inputs[name])
        if list(array.shape) != list(spec.shape):
            raise RuntimeBackendError(
                f"inputs: {name!r} has shape {list(array.shape)}, the plan was made for {list(spec.shape)}. "
                "Re-run `unity-eq optimize` with `--input-shape`."
            )
        out[name] = _as_input_dtype(name, array, np.dtype(spec.dtype))
    return out


def _as_input_dtype(name: str, array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as the model input's ``dtype``. Floats are refused for an integer or boolean input: a cast
    would truncate 0.7 to 0 and run the model on values nobody chose (token ids, indices, masks). Raw 2-byte
    values (numpy saves a bfloat16 array to .npz as ``V2``) are read as the input's ml_dtypes type."""
    if is_integral(dtype) and is_float(array.dtype):
        raise RuntimeBackendError(
            f"inputs: {name!r} is {dtype} in the model, the inputs file gives {array.dtype}; refusing to cast "
            f"floats to {dtype}. Save it as {dtype} (numpy: array.astype(np.{dtype}))."
        )
    if array.dtype.kind == "V" and array.dtype.itemsize == dtype.itemsize and array.dtype.fields is None:
        return array.view(dtype)
    return array.astype(dtype, copy=False)


def refuse_plan_output(output: Path, plan_dir: Path, what: str = "`--outputs`") -> None:
    """Refuse an output path that would overwrite the plan or its model: a file the plan in ``plan_dir``
    wrote (its plan.json's manifest: plan.json, device files, their data, stage directories' files), the
    model it was made from (plan.json's ``model.source``) or that model's external data files. Checked before
    the run, so a mistyped ``--outputs P/plan.json`` costs nothing and destroys nothing."""
    from unity_eq.planfile.manifest import plan_files

    target = output.resolve()
    root = Path(plan_dir)
    owned = plan_files(root) if root.is_dir() else None
    for name in sorted(owned[0]) if owned else ():
        if (root / name).resolve() == target:
            raise OptionError(
                f"{what} {output}: is {name}, a file of the plan in {plan_dir}; writing there would destroy the "
                "plan. Pass another path."
            )
    for model in _source_files(root):
        if model.resolve() == target:
            raise OptionError(
                f"{what} {output}: is {model}, the model the plan was made from (or its weight data); writing "
                "there would destroy it. Pass another path."
            )


def _source_files(root: Path) -> list[Path]:
    """The model a plan was made from (plan.json's source, when it is still there) and its external data."""
    from google.protobuf.message import DecodeError

    from unity_eq.planfile.manifest import model_source

    source = model_source(root)
    if source is None or not Path(source).is_file():
        return []
    path = Path(source)
    found = [path]
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (OSError, DecodeError):
        return found  # not a model onnx reads: there is no data file of it to protect
    from onnx import external_data_helper

    for tensor in proto.graph.initializer:
        if external_data_helper.uses_external_data(tensor):
            found.append(path.parent / external_data_helper.ExternalDataInfo(tensor).location)
    return found
