"""The Prefect tasks' retry rule: a failure a retry would repeat is not retried."""

from __future__ import annotations

from prefect.states import Failed

from serving.errors import BadInputError
from tasks.data.version import VersionError
from tasks.loop import (
    champion_tasks,
    data_tasks,
    evaluation_tasks,
    registry_tasks,
    training_tasks,
)
from tasks.loop.prefect_run import retry_transient

FAMILIES = (data_tasks, champion_tasks, training_tasks, evaluation_tasks, registry_tasks)


def _retried(error: BaseException) -> bool:
    return retry_transient(data_tasks.version, None, Failed(data=error))  # type: ignore[arg-type]


def test_a_deterministic_failure_is_not_retried_and_a_transient_one_is():
    assert not _retried(VersionError("dvc refused the store", retryable=False))
    assert not _retried(BadInputError("bad --store"))
    assert _retried(VersionError("the remote was unreachable", retryable=True))
    assert _retried(ConnectionError("MLflow went away"))


def test_every_task_that_retries_asks_the_rule_first():
    tasks = [t for module in FAMILIES for t in vars(module).values() if getattr(t, "retries", 0)]
    assert data_tasks.version in tasks and len(tasks) >= 9
    assert all(t.retry_condition_fn is retry_transient for t in tasks)
