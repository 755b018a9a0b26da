"""What a Prefect server needs before specops's deployments run on it, created idempotently:

- the ``process`` work pool that ``prefect.yaml``'s deployments target;
- one global concurrency limit per hardware target, ``promote-<hw>`` with one slot: the
  evaluate-gate-promote step holds it
  (:func:`tasks.loop.evaluation_steps.evaluate_gate_promote`), so two flows, on any
  machines, never evaluate and promote on one target at once;
- two automations that finish a flow run whose worker died: a run whose heartbeats stop
  (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, set on the worker) is marked ``Crashed``, and a
  crashed run tagged ``specops`` is put back to ``Scheduled`` (``AwaitingRetry``) for the
  next worker that polls the pool. specops's flows are idempotent per schedule slot
  (:mod:`flows.loop`), so the re-run resumes and registers nothing twice; a run that
  crashes over and over stops itself (``MAX_RUNS``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta

from serving.hardware import load_hardware
from tasks.settings import promotion_limit

log = logging.getLogger(__name__)

TAG = "specops"  # prefect.yaml's deployments carry it; the recovery automation matches it
HEARTBEAT_TIMEOUT_S = 75  # 2.5 heartbeats at the worker's 30 s
ZOMBIE = "specops: crash flow runs whose heartbeats stopped"
RESCHEDULE = "specops: reschedule crashed flow runs"


def _automations():
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    finished = {
        f"prefect.flow-run.{state}"
        for state in ("Completed", "Failed", "Cancelled", "Crashed", "Cancelling")
    }
    zombie = AutomationCore(
        name=ZOMBIE,
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *finished},
            match={"prefect.resource.id": ["prefect.flow-run.*"]},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=HEARTBEAT_TIMEOUT_S),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {HEARTBEAT_TIMEOUT_S} s: its worker died",
            )
        ],
    )
    reschedule = AutomationCore(
        name=RESCHEDULE,
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={
                "prefect.resource.role": "tag",
                "prefect.resource.id": f"prefect.tag.{TAG}",
            },
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.SCHEDULED,
                name="AwaitingRetry",
                message="crashed: rescheduled for the next worker (idempotent per slot)",
                force=True,
            )
        ],
    )
    return [zombie, reschedule]


def prepare_prefect(
    pool: str, *, env: dict[str, str], hardware: Iterable[str] | None = None
) -> dict[str, list[str]]:
    """Create what is missing (pool, limits, automations) on the API that ``env``'s
    ``PREFECT_API_URL`` names; return what was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    created: dict[str, list[str]] = {"pool": [], "limits": [], "automations": []}
    targets = sorted(hardware) if hardware is not None else sorted(load_hardware().targets)
    api = {PREFECT_API_URL: env["PREFECT_API_URL"]}
    with temporary_settings(updates=api), get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            created["pool"].append(pool)
        except ObjectAlreadyExists:
            pass
        for target in targets:
            name = promotion_limit(target)
            try:
                client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1)
                )
                created["limits"].append(name)
        for automation in _automations():
            if not client.read_automations_by_name(automation.name):
                client.create_automation(automation)
                created["automations"].append(automation.name)
    for kind, names in created.items():
        for name in names:
            log.info("created %s %s", kind, name)
    return created
