"""What a draft accepted when it was evaluated, read back from its version's tags: the
yardstick the retrain trigger and the watch hold live acceptance against, and the gauge a
server exports beside its live counters (docs/monitoring.md)."""

from __future__ import annotations

from collections.abc import Mapping

TRAFFIC = "traffic"  # evaluation prompts replayed from held-out collected traffic
TRAFFIC_PREFIX = f"{TRAFFIC}:"  # their workload in evaluation reports: traffic:<workload>


def evaluated_acceptance(
    tags: Mapping[str, str], hardware: str, workload: str
) -> tuple[float, str] | None:
    """What the version accepted on ``workload`` when evaluated on ``hardware`` (its held-out
    traffic of that workload first, then the built-in workload, then its evaluation
    overall), and which evaluation that was; None if never evaluated there."""
    for key, source in (
        (f"{hardware}/{TRAFFIC_PREFIX}{workload}/acceptance_rate", "its held-out traffic"),
        (f"{hardware}/{workload}/acceptance_rate", f"built-in {workload}"),
        (f"{hardware}/acceptance_rate", "its evaluation overall"),
    ):
        if key in tags:
            try:
                return float(tags[key]), source
            except ValueError:
                continue
    return None
