"""The bench's results: rows per workload and method (pooled over their prompts), the
text table ``specops bench`` prints, and the speedup plot."""

from __future__ import annotations

from pathlib import Path

from serving.engine.metrics import pool
from serving.hardware import DEFAULT_HARDWARE
from tasks.bench.bench_config import BASELINE
from tasks.bench.limits import limit_tokens_per_s


def summarize(
    runs: list[dict],
    methods: list[str],
    *,
    references: dict[str, str | None] | None = None,
    baseline: str = BASELINE,
    llamacpp_plain: str | None = None,
    weights: dict[str, dict] | None = None,
    bandwidth_bytes_per_s: float | None = None,
) -> list[dict]:
    """Rows per (workload, method) plus an ``all`` workload; sums, not mean of ratios.

    ``speedup`` divides a row's pooled tokens/s by the ``baseline``'s (HF greedy's),
    ``x_llama`` by llama.cpp plain's (``llamacpp_plain``) on the same prompts;
    ``identical`` says whether every output equals its reference row's (``references``);
    ``limit_tokens_per_s`` is bandwidth ÷ the weight bytes per token of the row's format
    (``weights[method]``), and
    ``of_limit`` the row's tokens/s as a share of it."""
    references = references or {}
    weights = weights or {}
    rows = []
    workloads = sorted({r["workload"] for r in runs})

    def rate_of(subset: list[dict], method: str | None) -> float | None:
        mine = [r for r in subset if r["method"] == method]
        seconds = sum(r["seconds"] for r in mine)
        return sum(len(r["token_ids"]) for r in mine) / seconds if seconds else None

    for workload in [*workloads, "all"]:
        subset = [r for r in runs if workload in ("all", r["workload"])]
        base_rate = rate_of(subset, baseline)
        llama_rate = rate_of(subset, llamacpp_plain) if llamacpp_plain else None
        for method in methods:
            mine = [r for r in subset if r["method"] == method]
            seconds = sum(r["seconds"] for r in mine)
            tokens = sum(len(r["token_ids"]) for r in mine)
            rate = tokens / seconds if seconds else None
            stats = [r["stats"] for r in mine if r["stats"] is not None]
            pooled = pool(_as_stats(s) for s in stats) if stats else {}
            weight = weights.get(method, {})
            per_token = weight.get("bytes_per_token")
            limit = (
                limit_tokens_per_s(bandwidth_bytes_per_s, per_token)
                if bandwidth_bytes_per_s and per_token
                else None
            )
            rows.append(
                {
                    "workload": workload,
                    "method": method,
                    "weights": weight.get("format"),
                    "prompts": len(mine),
                    "tokens": tokens,
                    "seconds": seconds,
                    "tokens_per_s": rate,
                    "speedup": rate / base_rate if rate and base_rate else None,
                    "x_llama": rate / llama_rate if rate and llama_rate else None,
                    "acceptance_rate": pooled.get("acceptance_rate"),
                    "mean_accepted_length": pooled.get("mean_accepted_length"),
                    "accepted_by_stage": sum_by_stage(stats),
                    "reference": references.get(method, baseline if method != baseline else None),
                    "baseline": baseline,
                    "identical": all(r["identical"] for r in mine),
                    "bytes_per_token": per_token,
                    "limit_tokens_per_s": limit,
                    "of_limit": rate / limit if rate and limit else None,
                }
            )
    return rows


def sum_by_stage(items: list[dict]) -> dict[str, int]:
    """Accepted drafts by the stage that drafted them, summed over ``items`` (requests'
    stats, or result rows) that carry ``accepted_by_stage``."""
    totals: dict[str, int] = {}
    for one in items:
        for stage, count in (one.get("accepted_by_stage") or {}).items():
            totals[stage] = totals.get(stage, 0) + int(count)
    return totals


def stage_shares(row: dict) -> str | None:
    """``head 41% · pld 59%`` of a row whose accepted drafts came from several stages."""
    by_stage = row.get("accepted_by_stage") or {}
    total = sum(by_stage.values())
    if len(by_stage) < 2 or not total:
        return None
    ordered = sorted(by_stage.items(), key=lambda item: -item[1])
    return " · ".join(f"{stage} {100 * count / total:.0f}%" for stage, count in ordered)


def _as_stats(stats: dict):
    from serving.engine.metrics import RequestStats

    return RequestStats(**stats)


def format_table(rows: list[dict], skipped: list[dict] | None = None) -> str:
    """The summary as a text table; skipped methods and why follow it."""

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    def same(row: dict) -> str:
        baseline = row.get("baseline", BASELINE)
        if row.get("reference") is None and row["method"] == baseline:
            return "(reference)"
        return f"{'yes' if row['identical'] else 'NO'} {row.get('reference') or baseline}"

    name_w = max([18, *(len(row["method"]) for row in rows)])
    weights_w = max([16, *(len(row.get("weights") or "") for row in rows)])
    header = (
        f"{'workload':<10} {'method':<{name_w}} {'weights':<{weights_w}} {'tok/s':>7} "
        f"{'speedup':>8} {'x llama':>7} {'accept':>7} {'mean len':>8} {'limit tok/s':>11} "
        f"{'% limit':>7}  identical to"
    )
    lines = [header, "-" * (len(header) + 12)]
    for row in rows:
        of_limit = row.get("of_limit")
        lines.append(
            f"{row['workload']:<10} {row['method']:<{name_w}} "
            f"{row.get('weights') or '-':<{weights_w}} "
            f"{fmt(row['tokens_per_s'], '.2f'):>7} {fmt(row['speedup'], '.2f'):>7}x "
            f"{fmt(row.get('x_llama'), '.2f'):>6}x {fmt(row['acceptance_rate'], '.3f'):>7} "
            f"{fmt(row['mean_accepted_length'], '.2f'):>8} "
            f"{fmt(row.get('limit_tokens_per_s'), '.1f'):>11} "
            f"{fmt(None if of_limit is None else 100 * of_limit, '.0f'):>6}%  {same(row)}"
        )
    for row in rows:
        shares = stage_shares(row)
        if shares:
            lines.append(f"accepted by stage, {row['workload']} {row['method']}: {shares}")
    for item in skipped or []:
        lines.append(f"skipped {item['method']}: {item['reason']}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, *, hardware: str = DEFAULT_HARDWARE) -> None:
    """A bar per method and workload: its speedup over the baseline, on ``hardware`` (a
    hardware target's name, as results store it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(workloads), 4.2))
    for i, method in enumerate(methods):
        values = [
            next(
                (r["speedup"] or 0.0 for r in rows if r["workload"] == w and r["method"] == method),
                0.0,
            )
            for w in workloads
        ]
        positions = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(workloads))]
        ax.bar(positions, values, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(workloads)), workloads)
    baseline = next((r["baseline"] for r in rows if r.get("baseline")), BASELINE)
    ax.set_ylabel(f"speedup over {baseline} (tokens/s ratio)")
    ax.set_title(f"specops bench: speculative decoding on `{hardware}`")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
