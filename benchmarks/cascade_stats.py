"""Statistics of the cascade sweep: ROUGE-L on token ids, t intervals over seeds, the
per-method summary, the frontier plot and the table."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasks.bench.quality import wilson_interval


def rouge_l(candidate: Sequence[int], reference: Sequence[int]) -> float:
    """ROUGE-L F1 of two token sequences: the longest common subsequence's length over
    each sequence's length, combined harmonically (1.0 for identical sequences, and for two
    empty ones)."""
    if not candidate and not reference:
        return 1.0
    if not candidate or not reference:
        return 0.0
    previous = [0] * (len(reference) + 1)
    for token in candidate:
        current = [0]
        for j, other in enumerate(reference, start=1):
            current.append(previous[j - 1] + 1 if token == other else max(previous[j], current[-1]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(candidate), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)


def mean_ci(
    values: Sequence[float],
    confidence: float = 0.95,
    bounds: tuple[float, float] | None = None,
) -> dict[str, float | None]:
    """Mean and a Student-t confidence interval over ``values`` (e.g. one per seed),
    clipped to ``bounds`` for a bounded metric (ROUGE-L lies in [0, 1])."""
    from scipy import stats

    clean = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not clean:
        return {"mean": None, "low": None, "high": None, "n": 0}
    mean = statistics.fmean(clean)
    if len(clean) < 2:
        return {"mean": mean, "low": None, "high": None, "n": len(clean)}
    sem = statistics.stdev(clean) / math.sqrt(len(clean))
    half = float(stats.t.ppf((1 + confidence) / 2, len(clean) - 1)) * sem
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return {"mean": mean, "low": low, "high": high, "n": len(clean)}


def summarize_method(
    runs: list[dict[str, Any]], *, plain: str, lossless: str
) -> dict[str, dict[str, Any]]:
    """Per method: speed (tokens/s, speedup over plain and over the lossless cascade, per
    seed and with a t interval over seeds), HumanEval pass@1 (pooled, Wilson interval, and
    the paired difference from the lossless cascade in points), ShareGPT ROUGE-L against
    the target's own output, exact-output share, stopping stages, unverified tokens."""
    methods = sorted({r["method"] for r in runs})
    seeds = sorted({r["seed"] for r in runs})
    by = {(r["method"], r["seed"], r["prompt_id"]): r for r in runs}

    def seconds(method: str, seed: int) -> tuple[float, int]:
        mine = [r for r in runs if r["method"] == method and r["seed"] == seed]
        return sum(r["seconds"] for r in mine), sum(r["tokens"] for r in mine)

    summary: dict[str, dict[str, Any]] = {}
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        speedups, over_lossless, rates, rouges = [], [], [], []
        for seed in seeds:
            s, tokens = seconds(method, seed)
            plain_s, plain_tokens = seconds(plain, seed)
            lossless_s, lossless_tokens = seconds(lossless, seed)
            if s > 0 and tokens:
                rate = tokens / s
                rates.append(rate)
                if plain_s > 0:
                    speedups.append(rate / (plain_tokens / plain_s))
                if lossless_s > 0:
                    over_lossless.append(rate / (lossless_tokens / lossless_s))
            rouge = [
                r["rouge_l"] for r in mine if r["seed"] == seed and r["workload"] == "sharegpt"
            ]
            if rouge:
                rouges.append(statistics.fmean(rouge))
        problems = [r for r in mine if r["workload"] == "humaneval"]
        passed = sum(bool(r["passed"]) for r in problems)
        gained = lost = 0
        for r in problems:
            base = by.get((lossless, r["seed"], r["prompt_id"]))
            if base is not None:
                gained += bool(r["passed"]) and not base["passed"]
                lost += bool(base["passed"]) and not r["passed"]
        stops: Counter[str] = Counter()
        for r in mine:
            stops.update(r.get("stops") or {})
        total_stops = sum(stops.values())
        low, high = wilson_interval(passed, len(problems)) if problems else (None, None)
        summary[method] = {
            "tokens_per_s": mean_ci(rates),
            "speedup": mean_ci(speedups),
            "speedup_over_lossless": mean_ci(over_lossless),
            "pass_at_1": passed / len(problems) if problems else None,
            "pass_at_1_ci": [low, high],
            "problems": len(problems),
            "pass_points_vs_lossless": 100 * (gained - lost) / len(problems) if problems else None,
            "problems_gained": gained,
            "problems_lost": lost,
            "rouge_l": mean_ci(rouges, bounds=(0.0, 1.0)),
            "identical_share": sum(r["identical"] for r in mine) / len(mine) if mine else None,
            "unverified_share": (
                sum(r["unverified"] for r in mine) / max(sum(r["tokens"] for r in mine), 1)
            ),
            "stops": {k: v / total_stops for k, v in sorted(stops.items())} if stops else {},
        }
    return summary


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _interval(ci: dict[str, Any], spec: str = ".2f") -> str:
    if ci["mean"] is None:
        return "-"
    if ci["low"] is None:
        return format(ci["mean"], spec)
    return f"{ci['mean']:{spec}} [{ci['low']:{spec}}, {ci['high']:{spec}}]"


def format_sweep_table(summary: dict[str, dict[str, Any]], order: Sequence[str]) -> str:
    lines = [
        f"{'method':<22} {'speedup vs plain':>22} {'vs lossless':>20} {'pass@1':>16} "
        f"{'Δpts':>6} {'ROUGE-L':>20} {'same':>5} {'unverif':>7}  stops"
    ]
    for method in order:
        row = summary.get(method)
        if row is None:
            continue
        low, high = row["pass_at_1_ci"]
        pass_text = (
            "-"
            if row["pass_at_1"] is None
            else f"{100 * row['pass_at_1']:.0f}% [{100 * low:.0f},{100 * high:.0f}]"
        )
        stops = " ".join(f"{k}:{100 * v:.0f}%" for k, v in row["stops"].items())
        same = None if row["identical_share"] is None else 100 * row["identical_share"]
        lines.append(
            f"{method:<22} {_interval(row['speedup']):>22} "
            f"{_interval(row['speedup_over_lossless']):>20} {pass_text:>16} "
            f"{_fmt(row['pass_points_vs_lossless'], '+.1f'):>6} "
            f"{_interval(row['rouge_l'], '.3f'):>20} "
            f"{_fmt(same, '.0f'):>4}% "
            f"{100 * row['unverified_share']:>6.1f}%  {stops}"
        )
    return "\n".join(lines)


def plot_frontier(
    summary: dict[str, dict[str, Any]], lambdas: dict[str, float], path: Path
) -> None:
    """Speed (× plain) against HumanEval pass@1 and ShareGPT ROUGE-L, one point per λ
    (labelled) and per ablation, with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, label in (
        (axes[0], "pass_at_1", "HumanEval pass@1 (executed)"),
        (axes[1], "rouge_l", "ShareGPT ROUGE-L vs the target's own output"),
    ):
        for method, row in summary.items():
            speed = row["speedup"]
            if speed["mean"] is None:
                continue
            if key == "pass_at_1":
                if row["pass_at_1"] is None:
                    continue
                y = row["pass_at_1"]
                low, high = row["pass_at_1_ci"]
            else:
                if row["rouge_l"]["mean"] is None:
                    continue
                y = row["rouge_l"]["mean"]
                low = row["rouge_l"]["low"] if row["rouge_l"]["low"] is not None else y
                high = row["rouge_l"]["high"] if row["rouge_l"]["high"] is not None else y
            xerr = None
            if speed["low"] is not None:
                xerr = [[speed["mean"] - speed["low"]], [speed["high"] - speed["mean"]]]
            is_lambda = method in lambdas
            ax.errorbar(
                speed["mean"],
                y,
                xerr=xerr,
                yerr=[[y - low], [high - y]],
                fmt="o" if is_lambda else "s",
                color="tab:blue" if is_lambda else "tab:gray",
                capsize=3,
            )
            ax.annotate(method, (speed["mean"], y), textcoords="offset points", xytext=(4, 4))
        lam_points = sorted(
            (lambdas[m], summary[m]["speedup"]["mean"], _y(summary[m], key))
            for m in lambdas
            if m in summary
            and summary[m]["speedup"]["mean"] is not None
            and _y(summary[m], key) is not None
        )
        if lam_points:
            ax.plot([p[1] for p in lam_points], [p[2] for p in lam_points], color="tab:blue")
        ax.set_xlabel("speedup over plain decoding (×)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle("Cascade λ sweep: speed against quality (λ = inf is lossless)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def _y(row: dict[str, Any], key: str) -> float | None:
    return row["pass_at_1"] if key == "pass_at_1" else row["rouge_l"]["mean"]
