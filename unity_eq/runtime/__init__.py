"""Running a plan directory, and checking it against the original model.

Every rank runs the same program (SPMD): its ``device_<rank>.onnx`` cut into *segments* at the collectives
(the stage numbers in ``plan.json``), with the collectives done by a :class:`Communicator` between segments.
Backends differ only in the communicator and in where ranks live:

* ``local`` (default): every rank is a thread of this process; collectives exchange numpy arrays in memory.
* ``mpi``: one process per rank under ``mpiexec`` (see ``unity_eq.runtime.mpi``).

Reductions sum the pieces in the order of the ranks of the group, in every backend, so results agree
bit for bit where the reduction order is the same.

Collectives and their reference semantics (``pieces`` are the ranks' arrays in group order, ``i`` is this
rank's index in the group, ``chunk(x, d, k)`` the k-th of n equal contiguous chunks of x along d):

==================  ==========================================  =============================================
collective          result on rank i                            plan.json ``kind`` (fields)
==================  ==========================================  =============================================
all_gather          concat(pieces, dim)                         ``all_gather`` (dim)
all_reduce          pieces[0] + pieces[1] + … (in group order)  ``all_reduce``
reduce_scatter      chunk(all_reduce, dim, i)                   ``reduce_scatter`` (dim)
all_to_all          concat([chunk(p, split_dim, i) for p], cd)  ``all_to_all`` (split_dim, concat_dim)
send / recv         point to point, by tag                      not in plans
==================  ==========================================  =============================================

Plans written today use only ``all_gather`` and ``all_reduce``; the runtime accepts the others.

The package, one module per job:

================  ==========================================================================================
module            what it does
================  ==========================================================================================
plandir           the plan directory as the runtime reads it (plan.json through planfile, file identities)
devices           CPU threads, CUDA devices and onnxruntime sessions (shared with lowering and profiling)
segments          a rank's device model cut into sessions at the collectives
collectives       the Communicator interface, reference semantics, and the in-process backend
execute           running all ranks on the local backend
mpi               the MPI backend (mpi4py, under ``mpiexec``): running a plan; imported only when asked for
mpi_supervisor    its process plumbing: loading mpi4py, the supervisor forked before MPI starts
mpi_status        its status rounds: the ranks agree on one error, the others end quietly
mpi_communicator  its Communicator over MPI sub-communicators (``open_communicator`` for your own code)
draws             ``check``'s random inputs: ``InputDraw``, ``default_draws``, ``random_inputs``
comparison        a plan's outputs against the original's, within a tolerance: ``compare_outputs``, ``CheckResult``
checker           ``check``: original vs plan on the same random inputs
================  ==========================================================================================
"""

from __future__ import annotations

from unity_eq.lower.onnxrt import make_session
from unity_eq.runtime.checker import assert_check, check, check_plan_is_of, default_int_ranges, run_original
from unity_eq.runtime.collectives import (
    Board,
    Communicator,
    LocalCommunicator,
    all_to_all_pieces,
    gather_pieces,
    group_of,
    reduce_scatter_pieces,
    run_collective,
    split_chunks,
    sum_pieces,
)
from unity_eq.runtime.comparison import CheckResult, OutputComparison, compare_outputs
from unity_eq.runtime.devices import (
    DeviceChoice,
    available_cores,
    choose_device,
    cuda_device_count,
    cuda_device_for,
    cuda_problem,
    cuda_providers,
    describe_devices,
    device_notes,
    threads_per_rank,
)
from unity_eq.runtime.draws import InputDraw, default_draws, random_inputs
from unity_eq.runtime.execute import COLLECTIVE_TIMEOUT_S, RankTimes, execute_local, execute_rank, run_plan
from unity_eq.runtime.plandir import (
    PlanDir,
    check_external_data,
    check_identity,
    check_inputs,
    check_rank_file,
    load_npz,
    load_plan_dir,
)
from unity_eq.runtime.segments import RankProgram, Segment, build_rank_program

__all__ = [
    "COLLECTIVE_TIMEOUT_S",
    "Board",
    "CheckResult",
    "Communicator",
    "DeviceChoice",
    "InputDraw",
    "LocalCommunicator",
    "OutputComparison",
    "PlanDir",
    "RankProgram",
    "RankTimes",
    "Segment",
    "all_to_all_pieces",
    "assert_check",
    "available_cores",
    "build_rank_program",
    "check",
    "check_external_data",
    "check_identity",
    "check_inputs",
    "check_plan_is_of",
    "check_rank_file",
    "choose_device",
    "compare_outputs",
    "cuda_device_count",
    "cuda_device_for",
    "cuda_problem",
    "cuda_providers",
    "default_draws",
    "default_int_ranges",
    "describe_devices",
    "device_notes",
    "execute_local",
    "execute_rank",
    "gather_pieces",
    "group_of",
    "load_npz",
    "load_plan_dir",
    "make_session",
    "random_inputs",
    "reduce_scatter_pieces",
    "run_collective",
    "run_original",
    "run_plan",
    "split_chunks",
    "sum_pieces",
    "threads_per_rank",
]
