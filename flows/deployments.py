"""Scheduled deployments of the loop's flows, served by one long-running process.

``specops loop serve`` (or ``python -m flows.deployments``) registers them with the Prefect
API it is pointed at (``PREFECT_API_URL``; start one with ``prefect server start``) and runs
their flow runs in-process; ``prefect deployment run collect/hourly`` then works. At scale
the same flows go to a work pool (process, Docker, Kubernetes) instead of ``serve``.
"""

from __future__ import annotations

from prefect import serve

from flows.loop import collect, evaluate_and_promote, retrain
from serving.hardware import DEFAULT_HARDWARE

SCHEDULES = {"collect/hourly": "0 * * * *", "retrain/daily": "30 3 * * *"}


def deployments(hardware: str = DEFAULT_HARDWARE):
    return [
        collect.to_deployment(
            name="hourly", cron=SCHEDULES["collect/hourly"], parameters={"hardware": hardware}
        ),
        retrain.to_deployment(
            name="daily", cron=SCHEDULES["retrain/daily"], parameters={"hardware": hardware}
        ),
        evaluate_and_promote.to_deployment(
            name="on-demand", parameters={"challengers": [], "hardware": hardware}
        ),
    ]


def main(hardware: str = DEFAULT_HARDWARE) -> None:
    serve(*deployments(hardware))


if __name__ == "__main__":
    main()
