"""The behaviour of one ``specops loop demo`` run, as a small JSON-able digest: what a
refactor promising "no behaviour change" must leave equal (tests/specops/test_loop_cli.py
compares it with tests/fixtures/behaviour/tiny-main-job.json).

It holds what is deterministic when the run is (step-bounded training, the gates' fixed
cost profile with the wall-clock interval off, the cost-aware policy priced by that profile,
MLflow run ids and the download cache named the same on every run: the fixtures of
tests/specops/test_loop_cli.py), and nothing that reads the clock:

- ``records``: every stored request (:func:`serving.records.store.read_raw` over the
  demo's store, sorted by timestamp then request id): its id (a hash of the collection's
  settings and the drafter's description, which orders the retrain's training mix), its
  workload, prompt, drafter version, output token ids, ``[proposed, accepted]`` per step
  and acceptance figures;
- ``flow``: from ``results/main/loop.json``, each evaluation's decision (champion,
  promoted, each challenger's gates with their checks, whose details carry the numbers
  priced by the fixed profile, and each contender's counts: tokens, checks, drafted,
  accepted, acceptance, losslessness), each collect's trigger and watch, the retrains'
  slots, challengers and training steps, and the drill's outcome. Left out: seconds,
  tokens/s and measured speedups, wall phases, run ids, timestamps, paths, shadow scores
  (advice, and priced with profiled drafting costs).

Floats are rounded to :data:`DIGITS` decimals.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from serving.records.store import read_raw

DIGITS = 6

# What a record keeps, and what an evaluation keeps of each contender's figures.
RECORD_FIELDS = (
    "id", "workload", "prompt_id", "drafter_version", "output_token_ids", "steps", "checks",
    "draft_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_length", "is_failure",
)  # fmt: skip
CONTENDER_FIELDS = (
    "requests", "generated_tokens", "checks", "draft_tokens", "accepted_tokens",
    "acceptance_rate", "mean_accepted_length", "acceptance_by_position", "lossless",
    "mismatched_prompts",
)  # fmt: skip


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, DIGITS)
    if isinstance(value, list):
        return [_round(v) for v in value]
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


def record_digest(store: Path) -> list[dict[str, Any]]:
    """Every record of ``store``, in serving order, with :data:`RECORD_FIELDS`."""
    rows = [row for _, row in read_raw(store)]
    bad = [row for row in rows if not isinstance(row, dict)]
    assert not bad, f"unreadable lines in {store}: {bad[:2]}"
    rows.sort(key=lambda row: (row["timestamp"], row["id"]))
    return [{k: _round(row[k]) for k in RECORD_FIELDS} for row in rows]


def _contenders(decision: Mapping[str, Any], group: Mapping[str, Any]) -> dict[str, Any]:
    """A results group keyed by registry label (``plain`` stays ``plain``)."""
    labels = decision.get("labels", {})
    return {
        labels.get(name, name): {k: _round(row[k]) for k in CONTENDER_FIELDS}
        for name, row in group.items()
    }


def decision_digest(decision: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if decision is None:
        return None
    return {
        "champion": decision["champion"],
        "promoted": decision["promoted"],
        "exports": decision["exports"],
        "gates": {
            label: {
                "passed": gate["passed"],
                "decided_by": gate["decided_by"],
                "checks": [[c["name"], c["passed"], c["detail"]] for c in gate["checks"]],
            }
            for label, gate in decision["gates"].items()
        },
        "results": _contenders(decision, decision["results"]),
        "by_workload": {
            workload: _contenders(decision, group)
            for workload, group in decision["by_workload"].items()
        },
    }


def _retrained(retrained: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if retrained is None:
        return None
    if "deployment" in retrained:  # handed to a deployment: nothing ran here
        return {"deployment": retrained["deployment"]}
    return {
        "slot": retrained["slot"],
        "scheduled": retrained.get("scheduled"),
        "challengers": [c["label"] for c in retrained["challengers"]],
        "trained": [
            {
                "family": t["family"],
                "skipped": t["skipped"],
                "steps": t["params"].get("steps"),
                "train_sequences": t["params"].get("train_sequences"),
                "continued": None if "init" not in t["params"] else t["params"]["init"] != "fresh",
            }
            for t in retrained["trained"]
        ],
        "decision": decision_digest(retrained["decision"]),
        "predictor": {k: retrained["predictor"][k] for k in ("challenger", "champion", "promoted")},
    }


def _collected(collected: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if collected is None:
        return None
    replayed, trigger, watch = collected["replayed"], collected["trigger"], collected["watch"]
    return {
        "served_by": None if replayed is None else replayed["champion"],
        "written": None if replayed is None else replayed["written"],
        "valid": collected["validation"]["validation"]["valid"],
        "trigger": {k: trigger[k] for k in ("champion", "wanted", "retrain", "reasons")},
        "watch": None
        if watch is None
        else {k: watch[k] for k in ("champion", "collapsed", "rolled_back_to", "reasons")},
        "retrained": _retrained(collected["retrained"]),
    }


def flow_digest(report: Mapping[str, Any]) -> dict[str, Any]:
    """The decisions of ``loop.json`` (the main job's report)."""
    flow = report["flow_result"]
    drill = flow["drill"]
    return {
        "bootstrap": decision_digest(flow["bootstrap"]),
        "phases": [_collected(phase) for phase in flow["phases"]],
        "daily_retrain": _retrained(flow["daily_retrain"]),
        "retrained": _retrained(flow["retrained"]),
        "drill": None
        if drill is None
        else {
            "skipped": drill["skipped"],
            "draft": drill["draft"],
            "displaced": drill["displaced"],
            "scrambled": len(drill["scrambled"]),
            "evaluated": decision_digest(drill["evaluated"]),
            "collected": _collected(drill["collected"]),
        },
    }


def loop_digest(store: Path, report: Path) -> dict[str, Any]:
    """The digest of one demo run: its ``store`` and its ``loop.json``."""
    return {
        "records": record_digest(store),
        "flow": flow_digest(json.loads(Path(report).read_text())),
    }


# ------------------------------------------------------------------- writing, comparing


def dumps(digest: Any) -> str:
    """Deterministic JSON (sorted keys): one line per record, per contender's figures and
    per gate check, small enough to read and diff."""

    def scalar(value: Any) -> bool:
        return not isinstance(value, dict | list)

    def numbers(value: Any) -> bool:  # a list of numbers, or of lists of them (steps)
        return isinstance(value, list) and all(
            isinstance(v, int | float) or (isinstance(v, list) and numbers(v)) for v in value
        )

    def inline(value: Any) -> bool:  # a scalar or a list of them, or a record, a row
        if isinstance(value, dict):
            return all(scalar(v) or numbers(v) for v in value.values())
        if isinstance(value, list):
            return all(scalar(v) for v in value) or numbers(value)
        return True

    def render(value: Any, depth: int) -> str:
        pad, inner = "  " * depth, "  " * (depth + 1)
        if inline(value):
            return json.dumps(value, sort_keys=True)
        if isinstance(value, dict):
            items = [
                f"{inner}{json.dumps(k)}: {render(value[k], depth + 1)}" for k in sorted(value)
            ]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        items = [f"{inner}{render(v, depth + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"

    return render(digest, 0) + "\n"


def differences(expected: Any, actual: Any, path: str = "") -> Iterator[str]:
    """Where ``actual`` differs from ``expected``, as ``path: expected ... != actual ...``,
    in ``actual``'s order (:func:`loop_digest`'s: the records, then the flow's steps as they
    ran), so that the first is the likeliest cause of the rest."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in [*actual, *(k for k in expected if k not in actual)]:
            here = f"{path}.{key}" if path else key
            if key not in actual:
                yield f"{here}: missing (expected {_short(expected[key])})"
            elif key not in expected:
                yield f"{here}: unexpected {_short(actual[key])}"
            else:
                yield from differences(expected[key], actual[key], here)
    elif (
        isinstance(expected, list)
        and isinstance(actual, list)
        and any(isinstance(v, dict | list) for v in expected + actual)
    ):
        for index, (e, a) in enumerate(zip(expected, actual, strict=False)):
            yield from differences(e, a, f"{path}[{index}]")
        if len(expected) != len(actual):
            yield f"{path}: {len(expected)} items expected, {len(actual)} found"
    elif expected != actual:
        yield f"{path}: expected {_short(expected)} != actual {_short(actual)}"


def _short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


def outline(digest: Mapping[str, Any]) -> dict[str, Any]:
    """What of a digest no CPU's float kernels can change: which requests were served, in
    order (workload and prompt), and which sections the flow's result has."""
    return {
        "records": [(r["workload"], r["prompt_id"]) for r in digest["records"]],
        "flow": sorted(digest["flow"]),
    }
