"""The main job's report: before/after figures from the evaluation that decided the
promotion, the acceptance of the replayed traffic over time, and a plot of both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializationInfo, model_serializer

from serving.atomic import write_json_atomic
from tasks.data.store_view import read_valid_records
from tasks.evaluate.gates import GateResult
from tasks.evaluate.report import ContenderResult
from tasks.loop.results import Decision, DemoResult, Drill


class _Figures(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AcceptancePoint(_Figures):
    """One request, in serving order."""

    request: int
    workload: str
    drafter: str  # the champion version that served it
    acceptance: float | None  # pooled over the last ``window`` requests
    mean_accepted_length: float | None  # of this request


class Numbers(_Figures):
    """A contender's figures in one evaluation (:data:`KEYS`)."""

    mean_accepted_length: float | None
    acceptance_rate: float | None
    speedup: float | None
    tokens_per_s: float | None
    lossless: bool

    @classmethod
    def of(cls, result: ContenderResult) -> Numbers:
        return cls(**{k: getattr(result, k) for k in KEYS})


class ContenderRow(Numbers):
    """One contender's figures in the demo's before/after table (a row of numbers under
    its registry label, not a reference to the draft)."""

    label: str  # the registry version (``plain``: plain decoding)
    traffic: Numbers | None = None  # on the held-out traffic, where the evaluation had some

    @model_serializer(mode="wrap")
    def _label_first_traffic_if_any(self, handler: Any, info: SerializationInfo) -> dict:
        data = handler(self)
        out = {"label": data.pop("label"), **data}
        if self.traffic is None:
            out.pop("traffic")
        return out


class BeforeAfter(_Figures):
    champion_before: str | None
    promoted: str | None
    before: ContenderRow | None  # the champion, when there was one
    challenger: ContenderRow | None  # the promoted one, else the fastest
    challengers: list[ContenderRow]
    plain: ContenderRow
    mean_accepted_length_gain: float | None  # challenger over the champion before
    gates: dict[str, GateResult]


class Regained(_Figures):
    """The share of what the drift cost the champion that the loop's draft regains."""

    workload: str
    champion: str
    champion_before_drift: float
    champion_after_drift: float
    loop_draft: str
    loop_draft_after_drift: float
    lost: float
    regained_share: float | None  # None when the drift cost (about) nothing
    speedup: float | None
    champion_speedup: float | None


class DrillSummary(_Figures):
    """The drill's outcome: the damaged champion, what the watch saw, what it restored."""

    draft: str
    displaced: str | None
    restored: bool  # the watch put ``displaced`` back
    rolled_back_to: str | None
    alarm: str | None
    watch: list[str]  # the watch's line per judged workload
    requests: int  # served by the damaged draft before the rollback


class DemoReport(_Figures):
    """``results/main/loop.json`` (with the flow's result beside it)."""

    acceptance_over_time: list[AcceptancePoint]
    before_after: BeforeAfter | None
    daily_retrain: BeforeAfter | None
    regained: Regained | None
    bootstrap: str | None  # the first champion's label, if bootstrap promoted one
    drill: DrillSummary | None = None  # None: the drill did not run (see the flow result)


def drill_summary(drill: Drill | None) -> DrillSummary | None:
    if drill is None or drill.draft is None or drill.collected is None:
        return None
    watch = drill.collected.watch
    replayed = drill.collected.replayed
    return DrillSummary(
        draft=drill.draft,
        displaced=drill.displaced,
        restored=drill.restored,
        rolled_back_to=None if watch is None else watch.rolled_back_to,
        alarm=None if watch is None else watch.alarm,
        watch=[] if watch is None else watch.reasons,
        requests=0 if replayed is None else replayed.written,
    )


def acceptance_over_time(store: Path, *, window: int = 8) -> list[AcceptancePoint]:
    """Per request, in serving order: its workload and the acceptance pooled over the last
    ``window`` requests (drafted tokens that were accepted)."""
    records = sorted(read_valid_records(store), key=lambda r: (r.timestamp, r.id))
    out = []
    for index, record in enumerate(records):
        recent = records[max(0, index + 1 - window) : index + 1]
        drafted = sum(r.draft_tokens for r in recent)
        accepted = sum(r.accepted_tokens for r in recent)
        out.append(
            AcceptancePoint(
                request=index + 1,
                workload=record.workload,
                drafter=record.drafter_version,
                acceptance=accepted / drafted if drafted else None,
                mean_accepted_length=record.mean_accepted_length,
            )
        )
    return out


KEYS = ("mean_accepted_length", "acceptance_rate", "speedup", "tokens_per_s", "lossless")


def before_after(decision: Decision) -> BeforeAfter:
    """The champion before, every challenger, and the one that counts (the promoted one,
    else the fastest): overall and on the held-out traffic."""
    results = decision.results
    traffic = decision.by_source.get("traffic", {})

    def pick(name: str) -> ContenderRow:
        return ContenderRow(
            label=decision.labels.get(name, name),
            **dict(Numbers.of(results[name])),
            traffic=Numbers.of(traffic[name]) if name in traffic else None,
        )

    names = [n for n in results if n.startswith("challenger")]
    challengers = [pick(n) for n in names]
    best = None
    if challengers:
        promoted = [c for c in challengers if c.label == decision.promoted]
        best = promoted[0] if promoted else max(challengers, key=lambda c: c.speedup or 0)
    before = pick("champion") if "champion" in results else None
    gain = None
    if before and best and before.mean_accepted_length and best.mean_accepted_length:
        gain = best.mean_accepted_length - before.mean_accepted_length
    return BeforeAfter(
        champion_before=decision.champion,
        promoted=decision.promoted,
        before=before,
        challenger=best,
        challengers=challengers,
        plain=pick("plain"),
        mean_accepted_length_gain=gain,
        gates=decision.gates,
    )


def regained(
    before_drift: Decision | None,
    after_drift: Decision,
    *,
    before: str,
    drifted: str,
) -> Regained | None:
    """The issue's figure: of the mean accepted length that the champion serving when the
    traffic drifted lost to the drift, the share the loop's promoted (else best) draft
    regains, on held-out drifted traffic. ``before_drift``: the evaluation of the retrain
    before the drift (its winner, or the champion it kept, serves when the drift starts; its
    held-out ``before`` traffic is the pre-drift figure); ``after_drift``: the retrain's
    after it (the same champion, and the loop's draft, on held-out ``drifted`` traffic)."""
    if before_drift is None:
        return None
    serving = before_drift.promoted or before_drift.champion
    names = {v: k for k, v in before_drift.labels.items()}
    pre_row = before_drift.by_workload.get(f"traffic:{before}", {})
    pre_result = pre_row.get(names.get(serving or "", ""))
    pre = None if pre_result is None else pre_result.mean_accepted_length
    rows = after_drift.by_workload.get(f"traffic:{drifted}", {})
    best = before_after(after_drift).challenger
    after_names = {v: k for k, v in after_drift.labels.items()}
    if best is None or serving is None or after_drift.champion != serving:
        return None
    if "champion" not in rows:
        return None
    hit = rows["champion"].mean_accepted_length
    mine = rows.get(after_names.get(best.label, ""))
    new = None if mine is None else mine.mean_accepted_length
    if pre is None or hit is None or new is None or mine is None:
        return None
    lost = pre - hit
    return Regained(
        workload=drifted,
        champion=serving,
        champion_before_drift=pre,
        champion_after_drift=hit,
        loop_draft=best.label,
        loop_draft_after_drift=new,
        lost=lost,
        # Meaningless when the drift cost nothing (or less than measurement noise).
        regained_share=(new - hit) / lost if lost > 0.05 else None,
        speedup=mine.speedup,
        champion_speedup=rows["champion"].speedup,
    )


def write_report(
    result: DemoResult,
    store: Path,
    out_dir: Path,
    *,
    before: str = "grounded",
    drifted: str = "humaneval",
) -> DemoReport:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    series = acceptance_over_time(store)
    decision = result.retrained.decision
    ba = before_after(decision)
    daily = None if result.daily_retrain is None else result.daily_retrain.decision
    summary = DemoReport(
        acceptance_over_time=series,
        before_after=ba,
        daily_retrain=None if daily is None else before_after(daily),
        regained=regained(daily, decision, before=before, drifted=drifted),
        bootstrap=None if result.bootstrap is None else result.bootstrap.promoted,
        drill=drill_summary(result.drill),
    )
    write_json_atomic(
        out_dir / "loop.json",
        {**summary.model_dump(mode="json"), "flow_result": result.model_dump(mode="json")},
    )

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for workload in dict.fromkeys(point.workload for point in series):
        points = [p for p in series if p.workload == workload and p.acceptance is not None]
        left.plot(
            [p.request for p in points], [p.acceptance for p in points], "o-", ms=3, label=workload
        )
    left.axhline(
        0.5, color="grey", ls="--", lw=1, label="absolute threshold (unevaluated champion)"
    )
    damaged = [p.request for p in series if summary.drill and p.drafter == summary.drill.draft]
    if damaged:
        outcome = "rolled back" if summary.drill and summary.drill.restored else "NOT rolled back"
        left.axvspan(
            min(damaged) - 0.5,
            max(damaged) + 0.5,
            color="red",
            alpha=0.12,
            label=f"drill: damaged champion, {outcome}",
        )
    left.set(
        xlabel="request (serving order)",
        ylabel="acceptance (rolling, 8 requests)",
        title="drift: acceptance of the champion draft",
        ylim=(0, 1),
    )
    left.legend()
    rows = [ba.plain, ba.before, *ba.challengers]
    names = ["plain", "champion"] + [c.label.removeprefix("specops-draft-") for c in ba.challengers]
    # On the held-out drifted traffic where the evaluation had some, else overall.
    shown: list[Numbers | None] = [None if r is None else r.traffic or r for r in rows]
    lengths = [(r and r.mean_accepted_length) or 0 for r in shown]
    speedups = [(r and r.speedup) or 0 for r in shown]
    xs = range(len(names))
    right.bar([x - 0.2 for x in xs], lengths, 0.4, label="mean accepted length")
    right.bar([x + 0.2 for x in xs], speedups, 0.4, label="speedup vs plain")
    right.set_xticks(list(xs), names, rotation=20)
    verdict = f"promoted {ba.promoted}" if ba.promoted else "champion kept"
    right.set(title=f"held-out traffic after drift: {verdict}")
    right.legend()
    figure.tight_layout()
    figure.savefig(out_dir / "loop.png", dpi=110)
    plt.close(figure)
    return summary
