"""The main job's report: before/after figures from the evaluation that decided the
promotion, the acceptance of the replayed traffic over time, and a plot of both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.atomic import write_json_atomic
from tasks.train.suffix_index import read_valid_records


def acceptance_over_time(store: Path, *, window: int = 8) -> list[dict[str, Any]]:
    """Per request, in serving order: its workload and the acceptance pooled over the last
    ``window`` requests (drafted tokens that were accepted)."""
    records = sorted(read_valid_records(store), key=lambda r: (r["timestamp"], r["id"]))
    out = []
    for index, record in enumerate(records):
        recent = records[max(0, index + 1 - window) : index + 1]
        drafted = sum(r["draft_tokens"] for r in recent)
        accepted = sum(r["accepted_tokens"] for r in recent)
        out.append(
            {
                "request": index + 1,
                "workload": record["workload"],
                "drafter": record["drafter_version"],
                "acceptance": accepted / drafted if drafted else None,
                "mean_accepted_length": record["mean_accepted_length"],
            }
        )
    return out


KEYS = ("mean_accepted_length", "acceptance_rate", "speedup", "tokens_per_s", "lossless")


def before_after(decision: dict[str, Any]) -> dict[str, Any]:
    """The champion before, every challenger, and the one that counts (the promoted one,
    else the fastest): overall and on the held-out traffic."""
    results = decision["results"]
    traffic = (decision.get("by_source") or {}).get("traffic", {})
    labels = decision.get("labels", {})

    def pick(name: str) -> dict[str, Any]:
        row = {k: results[name].get(k) for k in KEYS}
        if name in traffic:
            row["traffic"] = {k: traffic[name].get(k) for k in KEYS}
        return {"label": labels.get(name, name), **row}

    names = [n for n in results if n.startswith("challenger")]
    challengers = [pick(n) for n in names]
    best = None
    if challengers:
        promoted = [c for c in challengers if c["label"] == decision["promoted"]]
        best = promoted[0] if promoted else max(challengers, key=lambda c: c["speedup"] or 0)
    before = pick("champion") if "champion" in results else None
    gain = None
    if before and best and before["mean_accepted_length"] and best["mean_accepted_length"]:
        gain = best["mean_accepted_length"] - before["mean_accepted_length"]
    return {
        "champion_before": decision["champion"],
        "promoted": decision["promoted"],
        "before": before,
        "challenger": best,
        "challengers": challengers,
        "plain": pick("plain"),
        "mean_accepted_length_gain": gain,
        "gates": decision["gates"],
    }


def regained(
    before_drift: dict[str, Any] | None,
    after_drift: dict[str, Any],
    *,
    before: str,
    drifted: str,
) -> dict[str, Any] | None:
    """The issue's figure: of the mean accepted length that the champion serving when the
    traffic drifted lost to the drift, the share the loop's promoted (else best) draft
    regains, on held-out drifted traffic. ``before_drift``: the evaluation of the retrain
    before the drift (its winner, or the champion it kept, serves when the drift starts; its
    held-out ``before`` traffic is the pre-drift figure); ``after_drift``: the retrain's
    after it (the same champion, and the loop's draft, on held-out ``drifted`` traffic)."""
    if before_drift is None:
        return None
    serving = before_drift["promoted"] or before_drift["champion"]
    names = {v: k for k, v in before_drift.get("labels", {}).items()}
    pre_row = before_drift.get("by_workload", {}).get(f"traffic:{before}", {})
    pre = (pre_row.get(names.get(serving, "")) or {}).get("mean_accepted_length")
    rows = after_drift.get("by_workload", {}).get(f"traffic:{drifted}", {})
    best = before_after(after_drift)["challenger"]
    after_names = {v: k for k, v in after_drift.get("labels", {}).items()}
    if best is None or after_drift["champion"] != serving or "champion" not in rows:
        return None
    hit = rows["champion"].get("mean_accepted_length")
    new = (rows.get(after_names.get(best["label"], "")) or {}).get("mean_accepted_length")
    if pre is None or hit is None or new is None:
        return None
    lost = pre - hit
    return {
        "workload": drifted,
        "champion": serving,
        "champion_before_drift": pre,
        "champion_after_drift": hit,
        "loop_draft": best["label"],
        "loop_draft_after_drift": new,
        "lost": lost,
        # Meaningless when the drift cost nothing (or less than measurement noise).
        "regained_share": (new - hit) / lost if lost > 0.05 else None,
        "speedup": rows[after_names[best["label"]]].get("speedup"),
        "champion_speedup": rows["champion"].get("speedup"),
    }


def write_report(
    result: dict[str, Any],
    store: Path,
    out_dir: Path,
    *,
    before: str = "grounded",
    drifted: str = "humaneval",
) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    series = acceptance_over_time(store)
    decision = (result.get("retrained") or {}).get("decision")
    ba = before_after(decision) if decision else None
    daily = (result.get("daily_retrain") or {}).get("decision")
    summary = {
        "acceptance_over_time": series,
        "before_after": ba,
        "daily_retrain": before_after(daily) if daily else None,
        "regained": regained(daily, decision, before=before, drifted=drifted) if decision else None,
        "bootstrap": (result.get("bootstrap") or {}).get("promoted"),
    }
    write_json_atomic(out_dir / "loop.json", {**summary, "flow_result": result})

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for workload in dict.fromkeys(row["workload"] for row in series):
        rows = [r for r in series if r["workload"] == workload and r["acceptance"] is not None]
        left.plot([r["request"] for r in rows], [r["acceptance"] for r in rows], "o-", ms=3,
                  label=workload)  # fmt: skip
    left.axhline(
        0.5, color="grey", ls="--", lw=1, label="absolute threshold (unevaluated champion)"
    )
    left.set(xlabel="request (serving order)", ylabel="acceptance (rolling, 8 requests)",
             title="drift: acceptance of the champion draft", ylim=(0, 1))  # fmt: skip
    left.legend()
    if ba is not None:
        rows = [ba["plain"], ba["before"], *ba["challengers"]]
        names = ["plain", "champion"] + [
            c["label"].removeprefix("specops-draft-") for c in ba["challengers"]
        ]
        # On the held-out drifted traffic where the evaluation had some, else overall.
        shown = [(r or {}).get("traffic") or r or {} for r in rows]
        lengths = [r.get("mean_accepted_length") or 0 for r in shown]
        speedups = [r.get("speedup") or 0 for r in shown]
        xs = range(len(names))
        right.bar([x - 0.2 for x in xs], lengths, 0.4, label="mean accepted length")
        right.bar([x + 0.2 for x in xs], speedups, 0.4, label="speedup vs plain")
        right.set_xticks(list(xs), names, rotation=20)
        verdict = f"promoted {ba['promoted']}" if ba["promoted"] else "champion kept"
        right.set(title=f"held-out traffic after drift: {verdict}")
        right.legend()
    figure.tight_layout()
    figure.savefig(out_dir / "loop.png", dpi=110)
    plt.close(figure)
    return summary
