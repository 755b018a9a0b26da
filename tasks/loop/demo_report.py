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


def before_after(decision: dict[str, Any]) -> dict[str, Any]:
    results = decision["results"]
    challengers = [name for name in results if name.startswith("challenger")]
    keys = ("mean_accepted_length", "acceptance_rate", "speedup", "tokens_per_s", "lossless")

    def pick(name: str) -> dict[str, Any]:
        return {k: results[name].get(k) for k in keys}

    before = pick("champion") if "champion" in results else None
    after = pick(challengers[0]) if challengers else None
    gain = None
    if before and after and before["mean_accepted_length"] and after["mean_accepted_length"]:
        gain = after["mean_accepted_length"] - before["mean_accepted_length"]
    return {
        "champion_before": decision["champion"],
        "promoted": decision["promoted"],
        "before": before,
        "challenger": after,
        "plain": pick("plain"),
        "mean_accepted_length_gain": gain,
        "gates": decision["gates"],
    }


def write_report(result: dict[str, Any], store: Path, out_dir: Path) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    series = acceptance_over_time(store)
    decision = (result.get("retrained") or {}).get("decision")
    ba = before_after(decision) if decision else None
    summary = {
        "acceptance_over_time": series,
        "before_after": ba,
        "bootstrap": (result.get("bootstrap") or {}).get("promoted"),
    }
    write_json_atomic(out_dir / "loop.json", {**summary, "flow_result": result})

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for workload in dict.fromkeys(row["workload"] for row in series):
        rows = [r for r in series if r["workload"] == workload and r["acceptance"] is not None]
        left.plot([r["request"] for r in rows], [r["acceptance"] for r in rows], "o-", ms=3,
                  label=workload)  # fmt: skip
    left.axhline(0.5, color="grey", ls="--", lw=1, label="retrain threshold")
    left.set(xlabel="request (serving order)", ylabel="acceptance (rolling, 8 requests)",
             title="drift: acceptance of the champion draft", ylim=(0, 1))  # fmt: skip
    left.legend()
    if ba is not None:
        names = ["plain", "champion (before)", "challenger"]
        rows = [ba["plain"], ba["before"], ba["challenger"]]
        lengths = [r["mean_accepted_length"] if r else 0 for r in rows]
        speedups = [r["speedup"] if r else 0 for r in rows]
        xs = range(len(names))
        right.bar([x - 0.2 for x in xs], lengths, 0.4, label="mean accepted length")
        right.bar([x + 0.2 for x in xs], speedups, 0.4, label="speedup vs plain")
        right.set_xticks(list(xs), names)
        verdict = f"promoted {ba['promoted']}" if ba["promoted"] else "champion kept"
        right.set(title=f"held-out evaluation after drift: {verdict}")
        right.legend()
    figure.tight_layout()
    figure.savefig(out_dir / "loop.png", dpi=110)
    plt.close(figure)
    return summary
