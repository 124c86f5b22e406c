"""``plan.json``: the only code that reads and writes it, as typed records, with one validation for every verb.

Lowering builds a :class:`PlanRecord` (the whole file) and :func:`write_plan_json` writes it; the search fills
the records of what it found (:class:`PlanReport`: mesh search, baselines, extraction, memory, cost) and of how
it went (:class:`StatsRecord`). :func:`read_plan_json` checks the format and what every verb needs;
:func:`read_run_record` gives the runtime its records (:class:`RunRecord`: inputs, outputs, files,
collectives) and :func:`read_explain_record` gives ``explain`` and its pictures theirs (:class:`ExplainRecord`),
so no verb reads a raw dictionary. A plan file that this unity-eq cannot read (another format version, a
missing or mistyped field, a ``files`` list that does not name one plain file per rank, an unknown collective
or step) is a :class:`~unity_eq.errors.PlanError` naming the file and the field, never an IndexError or a
KeyError later on.

A record's fields are its plan.json keys, in the order they are written; a field with a default may be left
out of the file (and is left out when it holds its default; null is refused: absent is how it says "none"), a
field typed ``… | None`` without one is always written, null when None. Values are written as they were given
(``json.dumps`` with indent 1), so a record written and read back is the same record, and plan.json stays byte
for byte what it was when it was a dictionary.

The package, bottom up: :mod:`~unity_eq.planfile.checks` (the format version, :func:`read_plan_json` and the
field errors), :mod:`~unity_eq.planfile.run` (the runtime's records), :mod:`~unity_eq.planfile.codec` (the
generic record (de)serialization), :mod:`~unity_eq.planfile.sections` (model, mesh, machine, cost, tensors),
:mod:`~unity_eq.planfile.steps` (the steps), :mod:`~unity_eq.planfile.search` (what the search found and how it
went) and :mod:`~unity_eq.planfile.document` (the whole file and the part explain reads, written and read).
"""

from unity_eq.planfile.checks import PLAN_FORMAT_VERSION, read_plan_json
from unity_eq.planfile.codec import Record
from unity_eq.planfile.document import (
    ExplainRecord,
    PlanRecord,
    json_default,
    read_explain_record,
    write_plan_json,
)
from unity_eq.planfile.run import COLLECTIVE_KINDS, CollectiveRecord, InputRecord, RunRecord, read_run_record
from unity_eq.planfile.search import (
    BaselineRecord,
    BlocksRecord,
    CheaperBaselineRecord,
    CheapestRecord,
    DifferentiableRecord,
    ExtractionRecord,
    IlpProgramRecord,
    IlpRecord,
    MemoryUsageRecord,
    MeshSearchRecord,
    ParallelismRecord,
    PlanChoiceRecord,
    PlanMemoryRecord,
    PlanReport,
    ProfileStatsRecord,
    RunnerUpRecord,
    SaturationRecord,
    SkippedRecord,
    StatsRecord,
    TieBreakRecord,
    TrainingSearchRecord,
    TrialSecondsRecord,
    TriedRecord,
)
from unity_eq.planfile.sections import (
    AxisRecord,
    AxisTrafficRecord,
    CostRecord,
    DeviceKindRecord,
    LinkRecord,
    MachineRecord,
    MeshRecord,
    ModelInputRecord,
    ModelOutputRecord,
    ModelRecord,
    NodeRecord,
    OverlapRecord,
    RankRecord,
    TensorRecord,
    WeightRecord,
)
from unity_eq.planfile.steps import (
    BY_KIND as STEP_RECORDS,
)
from unity_eq.planfile.steps import (
    CollectiveStepRecord,
    CombineStepRecord,
    ComputeStepRecord,
    InputStepRecord,
    PartitionStepRecord,
    ReduceStepRecord,
    ReplicateStepRecord,
    StepRecord,
    WeightStepRecord,
)

__all__ = [
    "COLLECTIVE_KINDS",
    "PLAN_FORMAT_VERSION",
    "STEP_RECORDS",
    "AxisRecord",
    "AxisTrafficRecord",
    "BaselineRecord",
    "BlocksRecord",
    "CheaperBaselineRecord",
    "CheapestRecord",
    "CollectiveRecord",
    "CollectiveStepRecord",
    "CombineStepRecord",
    "ComputeStepRecord",
    "CostRecord",
    "DeviceKindRecord",
    "DifferentiableRecord",
    "ExplainRecord",
    "ExtractionRecord",
    "IlpProgramRecord",
    "IlpRecord",
    "InputRecord",
    "InputStepRecord",
    "LinkRecord",
    "MachineRecord",
    "MemoryUsageRecord",
    "MeshRecord",
    "MeshSearchRecord",
    "ModelInputRecord",
    "ModelOutputRecord",
    "ModelRecord",
    "NodeRecord",
    "OverlapRecord",
    "ParallelismRecord",
    "PartitionStepRecord",
    "PlanChoiceRecord",
    "PlanMemoryRecord",
    "PlanRecord",
    "PlanReport",
    "ProfileStatsRecord",
    "RankRecord",
    "Record",
    "ReduceStepRecord",
    "ReplicateStepRecord",
    "RunRecord",
    "RunnerUpRecord",
    "SaturationRecord",
    "SkippedRecord",
    "StatsRecord",
    "StepRecord",
    "TensorRecord",
    "TieBreakRecord",
    "TrainingSearchRecord",
    "TrialSecondsRecord",
    "TriedRecord",
    "WeightRecord",
    "WeightStepRecord",
    "json_default",
    "read_explain_record",
    "read_plan_json",
    "read_run_record",
    "write_plan_json",
]
