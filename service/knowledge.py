"""What a target learned in earlier jobs, loaded for the next one and grown by each (`tuner.knowledge`).

A worker loads a job's `Knowledge` before it tunes (`load_knowledge`: the scope's cost model and PPO policies) and
hands it to `tune_operator` / `tune_model`; the job's searches start warm from it and record what they measure and
learn into it. When the tuning ends, cancelled and timed-out jobs included (their measurements are as real),
`save_knowledge` appends the job's samples, stores its agents' policies and refits the scope's cost model on its
latest rows (a few seconds in the worker, after the job's own work). A lost lease saves nothing: the job's next
worker measures it again.

A scope is a target and the device measured on (`scope_of`): what one machine taught says nothing of another.
A fresh installation starts cold: the first job's tasks rank with their own measurements only.

Layering: the worker's side of `service`; the API process never imports it (it loads xgboost and torch).
"""

from __future__ import annotations

import logging
from typing import Any

from service.db import session_scope
from service.models import KnowledgeSample, LearnedModel
from service.requests import schedule_key
from tuner.knowledge import FEATURE_VERSION, MAX_ROWS, Knowledge, Samples, TargetModel

log = logging.getLogger("altune.knowledge")

COST_MODEL = "cost_model"  # the learned_models name of a scope's cost model; every other name is a policy's key


def scope_of(request: Any) -> str:
    """The scope of a request's knowledge: its target, and the device it is measured on when it names one."""
    key = schedule_key("", request)
    return key.target_key if not key.device else f"{key.target_key} @device {key.device}"


def load_knowledge(url: str, scope: str) -> Knowledge:
    """The scope's cost model (None: none yet, or one of another feature version, logged) and policies."""
    knowledge = Knowledge()
    with session_scope(url) as s:
        rows = [(m.name, bytes(m.data)) for m in LearnedModel.where_scope(s, scope)]
    policies = {}
    for name, data in rows:
        if name == COST_MODEL:
            knowledge.cost_model = TargetModel.from_bytes(data, source=f"{scope} cost model")
        else:
            policies[name] = data
    knowledge.policies = policies
    return knowledge


def save_knowledge(url: str, scope: str, knowledge: Knowledge, job_id: int | None, *, refit_model: bool = True
                   ) -> dict[str, Any]:
    """Appends the job's samples (one row per workload), stores its agents' policies, refits the scope's cost model
    on its latest `MAX_ROWS` rows (unless not `refit_model`: a round another worker ran for a job whose own worker
    refits at its end); returns what was kept (for the job's report)."""
    merged: dict[str, list[Samples]] = {}
    for batch in knowledge.samples:
        merged.setdefault(batch.workload_key, []).append(batch)
    added = 0
    with session_scope(url) as s:
        for workload_key, batches in merged.items():
            joined = Samples.joined(batches)
            s.add(KnowledgeSample(scope=scope, feature_version=FEATURE_VERSION, workload_key=workload_key,
                                  job_id=job_id, rows=len(joined.latencies_ms), data=joined.to_bytes()))
            added += len(joined.latencies_ms)
        for key, data in knowledge.updated_policies.items():
            LearnedModel.upsert(s, scope, key, data, 0, job_id)
    model = refit(url, scope, job_id) if added and refit_model else None
    return {"samples": added, "policies": len(knowledge.updated_policies),
            "cost_model_rows": model.rows if model is not None else None}


def refit(url: str, scope: str, job_id: int | None = None) -> TargetModel | None:
    """The scope's cost model fit on its latest samples of this feature version, stored (None: too few yet)."""
    with session_scope(url) as s:
        batches = [Samples.from_bytes(r.workload_key, bytes(r.data))
                   for r in KnowledgeSample.where_latest(s, scope, FEATURE_VERSION, MAX_ROWS)]
    model = TargetModel.fit(batches)
    if model is None:
        return None
    with session_scope(url) as s:
        LearnedModel.upsert(s, scope, COST_MODEL, model.to_bytes(), model.rows, job_id)
    log.info("%s: cost model refit on %d rows of %d workloads", scope, model.rows, model.workloads)
    return model
