"""Settings from the environment (`ALTUNE_*`) and flags; the only place that reads them."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything the service can be told; each field is `ALTUNE_<NAME>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="ALTUNE_", extra="ignore")

    data_dir: Path = Field(Path("var"), description="where the embedded database and artifacts live by default")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite file in data_dir")
    artifact_dir: Path | None = Field(None, description="where compiled artifacts are stored; default: data_dir/artifacts")
    host: str = "127.0.0.1"
    port: int = 8000
    max_budget: int = Field(10_000, description="largest accepted measurement budget of a job")
    max_tensor_elements: int = Field(1 << 26, description="largest accepted tensor (elements) of a workload")
    max_upload_bytes: int = Field(1 << 30, description="largest accepted model upload (bytes)")
    max_unpacked_bytes: int = Field(1 << 30, description="largest total of an upload's zip members, unpacked")
    max_zip_ratio: float = Field(100.0, description="largest unpacked/packed ratio of an upload's member over 1 MiB")
    sandbox_memory_bytes: int = Field(8 << 30, description="address space of the process that loads an upload")
    sandbox_cpu_seconds: int = Field(300, description="CPU seconds the process that loads an upload may use")
    sandbox_timeout_seconds: float = Field(300.0, description="wall-clock seconds it may take")
    sandbox_processes: int = Field(2, description="uploads loaded at once (each in its own process); others wait")
    time_torch_compile: bool = Field(
        True, description="a model job also times torch.compile (inductor, frozen weights) on the uploaded program "
                          "when it is prepared, in the same confined process (which then runs the system's C++ "
                          "compiler); it may take a minute of the sandbox's time limits, and when it fails or does "
                          "not fit, the job goes on without that number")
    anytime_artifact: bool = Field(
        True, description="a model job first builds the model from what is known before measuring (stored, "
                          "transferred and seed schedules), checks it and serves it as its artifact while it tunes: "
                          "one more whole-model build per job")
    learn: bool = Field(
        True, description="jobs start from what earlier jobs on the same target and device learned (a cost model "
                          "trained on all their measurements, the PPO agents' policies) and add to it when they end; "
                          "off: every job tunes cold and keeps nothing learned (schedules are stored either way)")
    lease_seconds: float = Field(30.0, description="a worker that has not renewed its lease for this long loses its job")
    poll_seconds: float = Field(1.0, description="how often an idle worker looks for a queued job")
    max_attempts: int = Field(3, description="claims of one job before it is failed (a job that kills workers)")
    measure_timeout: float = Field(60.0, description="seconds a candidate may take to build and run")
    measurer: Literal["local", "simulated"] = Field(
        "local", description="how a worker measures a job that names no device: local (built and run on this "
                             "machine) or simulated (nothing built; a latency that is a fixed function of the "
                             "configuration: for load tests and scaling benchmarks, never for real tuning)")
    simulated_delay_seconds: float = Field(
        0.0, ge=0, description="with the simulated measurer: wall-clock seconds each measurement takes (a sleep, no "
                               "CPU work: a device's time, for scaling benchmarks)")
    worker_nice: int = Field(
        10, ge=0, le=19, description="how much a worker lowers its CPU priority (and its measurement and build "
                                     "processes', which inherit it) below the API's: the dashboard stays responsive "
                                     "while tuning runs on the same cores; 0 keeps the same priority")
    db_retry_seconds: float = Field(
        120.0, ge=0, description="how long a worker keeps retrying a database write (a trial, a finished job) while "
                                 "the database is unreachable or locked before it leaves the job to its lease; an "
                                 "outage shorter than this loses no trial and needs no restart")
    rpc_tracker: str | None = Field(
        None, pattern=r"^[^\s:]+:\d{1,5}$",
        description="TVM RPC tracker (`python -m tvm.exec.rpc_tracker`) as HOST:PORT; jobs that name a `device` key "
                    "are measured on a device leased from it (built on the worker's host); unset: only local jobs")
    rpc_wait_seconds: float = Field(
        600.0, ge=0, description="how long a measurement waits for a device of its key (none registered, or one "
                                 "that keeps failing) before the job fails with that reason (its trials are kept)")
    allowed_origins: list[str] = Field(
        [], description="web origins besides the server's own that may submit, cancel and upload from a browser "
                        "(JSON list, e.g. [\"https://dash.example.com\"]); others get 403")

    anonymous: Literal["none", "read", "all"] = Field(
        "none", description="what a request without a token may do: nothing (`none`), read (`read`), or read and "
                            "write (`all`); a token it does send is always checked")
    jobs_visible: Literal["all", "own"] = Field(
        "all", description="which jobs a token reads: `all`, or only its `own` (an admin token reads all)")
    token_max_queued: int = Field(100, ge=0, description="default per token: its jobs waiting in the queue at once")
    token_max_running: int = Field(4, ge=0, description="default per token: its jobs the workers run at once")
    token_max_trials_per_day: int = Field(
        200_000, ge=0, description="default per token: the budgets (trials) of the jobs it submits per UTC day")
    token_max_upload_bytes_per_day: int = Field(
        8 << 30, ge=0, description="default per token: bytes of model files it uploads per UTC day")

    # the API under hostile clients (issue 59)
    max_json_body_bytes: int = Field(
        1 << 20, ge=0, description="largest request body of a JSON route (bytes): a larger one is refused with 413 "
                                   "from its Content-Length before it is read, or at the first byte over")
    upload_queue: int = Field(
        2, ge=0, description="model submissions (uploads and zoo jobs) that may wait for one of the "
                             "`sandbox_processes`; more at once are refused with 503 and Retry-After")
    max_streams: int = Field(
        200, ge=0, description="event streams (`/events`, `/jobs/{id}/events`) the API keeps open at once; one more "
                               "is refused with 429 (each dashboard tab holds one or two)")
    max_streams_per_token: int = Field(
        20, ge=0, description="event streams one token keeps open at once (requests without a token: per client "
                              "address); one more is refused with 429")
    worker_restart_max_seconds: float = Field(
        60.0, gt=0, description="`altune serve` restarts a worker that died after 1 s, doubling the wait for each "
                                "death in a row up to this many seconds (a worker that ran a minute starts over)")

    # bounded jobs (issue 59)
    job_deadline_seconds: float = Field(
        86_400.0, gt=0, description="wall-clock seconds a job may run from its first claim (on the database's "
                                    "clock) before it is stopped and failed, saying so; its trials are kept")
    build_timeout_seconds: float = Field(
        1_800.0, gt=0, description="wall-clock seconds a model job's final build, check and timing may take (it "
                                   "runs in a child process with `sandbox_memory_bytes` of address space)")
    build_cpu_seconds: int = Field(3_600, gt=0, description="CPU seconds that build may use")

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'altune.db').resolve()}"

    @property
    def resolved_artifact_dir(self) -> Path:
        return (self.artifact_dir or self.data_dir / "artifacts").resolve()


@cache
def get_settings() -> Settings:
    return Settings()
