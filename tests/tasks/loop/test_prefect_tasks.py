"""The Prefect tasks' retry rule: a failure a retry would repeat is not retried."""

from __future__ import annotations

from prefect.states import Failed

import tasks.loop.prefect_tasks as steps
from serving.errors import BadInputError
from tasks.data.version import VersionError


def _retried(error: BaseException) -> bool:
    return steps.retry_transient(steps.version, None, Failed(data=error))  # type: ignore[arg-type]


def test_a_deterministic_failure_is_not_retried_and_a_transient_one_is():
    assert not _retried(VersionError("dvc refused the store", retryable=False))
    assert not _retried(BadInputError("bad --store"))
    assert _retried(VersionError("the remote was unreachable", retryable=True))
    assert _retried(ConnectionError("MLflow went away"))


def test_every_task_that_retries_asks_the_rule_first():
    tasks = [t for t in vars(steps).values() if getattr(t, "retries", 0)]
    assert steps.version in tasks and len(tasks) >= 9
    assert all(t.retry_condition_fn is steps.retry_transient for t in tasks)
