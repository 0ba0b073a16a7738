"""Request and response bodies of the REST API (families: `XCreate`, `XPublic`, `XsPublic`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer

from compiler.workloads import EPILOGUES

MAX_SEED = 2**31 - 1  # the largest search seed: `tuner.task.MAX_SEED` (the API process does not import tuner)
MAX_INT32 = 2**31 - 1  # ids, counts and sizes: the database stores them as `integer` (32 bits on PostgreSQL)
MAX_INT64 = 2**63 - 1  # offsets: SQL's OFFSET takes a 64-bit integer

BUDGET_PER_COMPLEX_TASK = 8  # a model job's default budget: one round of ALT's batch per conv or matmul task ...
DEFAULT_MODEL_BUDGET = (64, 512)  # ... within these bounds (ResNet-50's 28: 224)


def default_model_budget(complex_tasks: int) -> int:
    """The budget a model job gets when its user names none: `BUDGET_PER_COMPLEX_TASK` measurements per conv or
    matmul task (the tasks whose schedule matters most), within `DEFAULT_MODEL_BUDGET`, so that the job's
    duration follows the model's size and stays bounded."""
    low, high = DEFAULT_MODEL_BUDGET
    return max(low, min(high, BUDGET_PER_COMPLEX_TASK * complex_tasks))


def _as_utc(value: datetime | None) -> datetime | None:
    # the database stores naive UTC; say so on the wire
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


UTCDateTime = Annotated[
    datetime, AfterValidator(_as_utc), PlainSerializer(lambda d: _as_utc(d).isoformat(), return_type=str, when_used="json")
]


class OperatorJobCreate(BaseModel):
    """Tune one operator from the catalog (`GET /api/v1/operators`)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,  # the schema's types exactly: `"seed": false` or `"budget": "64"` is a 422, not a 0 or a 64
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "kind": "operator",
                    "operator": "conv2d",
                    "params": {
                        "batch": 1, "in_channels": 64, "height": 56, "width": 56,
                        "out_channels": 64, "kernel": 3, "stride": 1, "padding": 1,
                    },
                    "dtype": "float32",
                    "target": "host",
                    "budget": 64,
                }
            ]
        },
    )

    kind: Literal["operator"] = "operator"
    operator: str = Field(max_length=64, description="operator name from the catalog, e.g. conv2d")
    params: dict[str, Annotated[int, Field(ge=0, le=MAX_INT32)]] = Field(
        max_length=32, description="the operator's integer parameters (see the catalog for names and limits)"
    )
    dtype: str = Field("float32", max_length=16, description="element type of every tensor")
    epilogue: Literal[EPILOGUES] = Field(
        "none", description="element-wise stages fused after the operator, in this order: bias (an input per output "
                            "channel), relu, requantize (int8 only: the int32 sums to a uint8 output, "
                            "clip(nearbyint(float32(sum) * scale[c]) + zero_point[c], 0, 255), with a float32 "
                            "scale and an int32 zero_point input per output channel)"
    )
    target: str = Field("host", max_length=32, description="where to tune and run: host (this CPU, detected) or llvm; "
                                                          "cuda is refused: no GPU schedule space yet")
    budget: int = Field(64, ge=1, le=MAX_INT32, description="number of on-device measurements (at most the "
                                                            "server's ALTUNE_MAX_BUDGET)")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="random seed of the search")
    layout_levels: Literal[1, 2] = Field(
        1, description="layout templates of the ALT search: 1 (one-level tiling, the default) or 2 (two-level "
                       "output tiling, N H/(ht' ht) W/(wt' wt) O/(ot' ot) ht' wt' ot' ht wt ot: a larger space "
                       "that pays off only with a larger budget)"
    )
    licm: bool = Field(True, description="build every candidate and the artifact with our loop-invariant code "
                                         "motion (normalize index and condition arithmetic, hoist what pays); "
                                         "false: TVM's default TIR pipeline")
    device: str | None = Field(
        None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$",
        description="measure on a device of this key leased from the server's TVM RPC tracker (`GET "
                    "/api/v1/devices` lists the keys; the server needs ALTUNE_RPC_TRACKER); candidates are built on "
                    "the worker's host for `target`, which must be what the device runs. Omitted: on the worker itself")


class TaskPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    index: int
    name: str
    workload_key: str
    weight: int
    budget: int
    trials_done: int
    best_latency_ms: float | None
    baseline_ms: float | None
    best_config: dict[str, Any] | None


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    name: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    target: str
    budget: int
    trials_done: int = Field(description="measurements done of the budget")
    errors: int = Field(description="measurements that failed (build, crash, timeout, wrong result)")
    best_latency_ms: float | None = Field(description="best measured latency so far (median of its repeats)")
    baseline_ms: float | None = Field(description="latency of the untuned program")
    error: str | None = Field(description="why the job failed, if it did")
    cancel_requested: bool
    attempts: int = Field(description="how many times a worker claimed this job")
    owner_id: int | None = Field(None, description="id of the token that submitted it (None: anonymously); only "
                                                   "it or an admin token may cancel or delete the job")
    worker_id: str | None = Field(None, description="the worker that holds (or last held) the job")
    lease_expires_at: UTCDateTime | None = Field(
        None, description="while running: when the worker's lease runs out unless renewed (past = worker lost)"
    )
    spec: dict[str, Any] = Field(description="the job as submitted (what the API validated), never changed by a worker")
    report: dict[str, Any] | None = Field(
        None, description="a model job's report, written by its worker: the joint stage (layout_search), the "
                          "whole-model check, removed schedules, the served build's latencies")
    created_at: UTCDateTime
    started_at: UTCDateTime | None
    finished_at: UTCDateTime | None
    updated_at: UTCDateTime
    tasks: list[TaskPublic] = []
    has_artifact: bool = False
    trials_by_stage: dict[str, int] = Field({}, description="measured trials per search stage (joint, loop)")
    last_trial_at: UTCDateTime | None = Field(None, description="when the latest trial was measured")


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class TrialPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    task_id: int
    index: int
    config: dict[str, Any]
    latencies_ms: list[float] | None
    latency_ms: float | None = Field(description="median of latencies_ms; null for an error trial")
    error: str | None
    predicted: float | None = Field(description="cost model score when the candidate was chosen")
    stage: str
    extra: dict[str, Any]
    created_at: UTCDateTime


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    count: int = Field(description="the job's trials that match the `status` filter, on every page")
    next: str | None = Field(None, description="pass as `cursor` for the next page; null on the last page")


class ChartPointPublic(BaseModel):
    """A bucket of consecutive trials, numbered from 1 in measurement order."""

    model_config = ConfigDict(from_attributes=True)

    first: int = Field(description="the number of the bucket's first trial")
    last: int = Field(description="the number of its last trial")
    errors: int = Field(description="its trials that failed (no latency)")
    min_ms: float | None = Field(description="its fastest trial's latency (null: every one failed)")
    max_ms: float | None = Field(description="its slowest trial's latency")
    best_ms: float | None = Field(description="the job's best latency up to and including this bucket")


class TaskBestPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    task_id: int
    last: int = Field(description="the last trial of the bucket in which the task's best latency improved")
    best_ms: float = Field(description="the task's best latency from then on")


class TrialChartPublic(BaseModel):
    """A job's search curve downsampled on the server: at most `points` buckets however many trials it has."""

    model_config = ConfigDict(from_attributes=True)

    count: int = Field(description="trials counted (those up to `last_id`)")
    last_id: int = Field(description="the newest trial counted: resume the job's event stream from it "
                                     "(`?last_event_id=`) and nothing is missed or sent twice")
    points: list[ChartPointPublic]
    task_best: list[TaskBestPublic] = Field(description="each task's best-so-far steps (for a job of several tasks)")
    stage_boundary: int | None = Field(description="the number of the first loop-only trial after joint-stage ones")
    stages: dict[str, int] = Field(description="trials per search stage (joint, loop)")
    timeouts: int = Field(description="error trials that timed out")
    best: list[TrialPublic] = Field([], description="each task's fastest measured trial, in task order")


class SchedulePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    workload_key: str
    target_key: str
    device: str = Field(description="the RPC device key it was measured on; empty: a worker's own CPU")
    pipeline: str = Field(description="the TIR pipeline it was built with (licm, default)")
    space_version: int = Field(description="the version of the search spaces its configuration belongs to")
    config: dict[str, Any]
    latency_ms: float
    job_id: int | None
    updated_at: UTCDateTime


class SchedulesPublic(BaseModel):
    data: list[SchedulePublic]
    count: int


class ParamPublic(BaseModel):
    name: str
    minimum: int
    maximum: int
    default: int | None
    required: bool
    description: str


class OperatorPublic(BaseModel):
    name: str
    description: str
    params: list[ParamPublic]


class OperatorsPublic(BaseModel):
    data: list[OperatorPublic]
    dtypes: list[str]
    epilogues: list[str]
    targets: list[str] = Field(description="the targets this server can tune for (CPU targets only: no GPU "
                                                   "schedule space yet)")


class ZooModelPublic(BaseModel):
    name: str = Field(description="the name to pass as `model` to `POST /api/v1/models/zoo`")
    description: str
    input_shapes: list[list[int]] = Field(description="example input shapes in call order (batch 1)")
    input_dtypes: list[str] = Field(description="their element types, e.g. float32, int64 for token ids")


class ZooModelsPublic(BaseModel):
    data: list[ZooModelPublic]
    count: int


class ErrorPublic(BaseModel):
    """Every error but a 422: what went wrong, in words that say what to fix."""

    detail: str


class DevicePublic(BaseModel):
    """One device key of the RPC tracker's queue."""

    key: str = Field(description="the key servers registered with (`rpc_server --key`), what a job's `device` names")
    total: int = Field(description="servers registered with this key")
    free: int = Field(description="of them, not leased at the moment")
    pending: int = Field(description="requests waiting for one")


class DevicesPublic(BaseModel):
    tracker: str | None = Field(description="the tracker's HOST:PORT (ALTUNE_RPC_TRACKER); null: none configured, "
                                            "every job is measured on its worker")
    data: list[DevicePublic]
    count: int


class Health(BaseModel):
    status: Literal["ok"]
    database: Literal["ok"]
