"""What the loop's steps share with Prefect: the retry rule of its tasks, and the log of
the run a step runs in."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from serving.errors import BadInputError

if TYPE_CHECKING:
    from prefect.client.schemas.objects import State, TaskRun

log = logging.getLogger("tasks.loop")


def retry_transient(task: object, task_run: TaskRun, state: State) -> bool:
    """Prefect's ``retry_condition_fn``: retry a failed task run unless its error says a
    retry would fail the same way: bad input, or an error marked ``retryable = False``
    (:class:`tasks.data.version.VersionError` when DVC refused the data)."""
    error = state.data
    if isinstance(error, BadInputError):
        return False
    return bool(getattr(error, "retryable", True))


def run_log() -> logging.Logger | logging.LoggerAdapter:
    """The log of the Prefect flow or task run this is called in (its lines go to the
    run's log, as the flows' own do); outside any run (a plain call, a test), the
    ``tasks.loop`` logger."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return log
