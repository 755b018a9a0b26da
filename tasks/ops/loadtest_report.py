"""The load test's report: the results as a Markdown table and a plot, written beside the
results file (``loadtest.json``, ``.md``, ``.png``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from serving.atomic import atomic_path, write_json_atomic, write_text_atomic
from tasks.ops.loadtest_types import LevelSummary, LoadSweepResults, LoadTableRow


def table_rows(levels: list[LevelSummary]) -> list[LoadTableRow]:
    """The table's figures, one row per level (the results file keeps them as data)."""
    return [
        {
            "clients": level["clients"],
            "tokens_per_s": level["tokens_per_s"],
            "speedup_vs_one_client": level["speedup_vs_one_client"],
            "requests_per_s": level["requests_per_s"],
            "latency_p50_s": level["latency_s"]["p50"],
            "latency_p90_s": level["latency_s"]["p90"],
            "ttft_p50_s": level["ttft_s"]["p50"],
            "peak_rss_mb": level["server_rss_mb"]["peak"],
            "errors": level["errors"],
            "outputs_equal": level["outputs_equal"],
            "mismatched_prompts": level["mismatched_prompts"],
        }
        for level in levels
    ]


def _cell(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _equal_cell(row: LoadTableRow) -> str:
    if row["outputs_equal"] is None:
        return "n/a"
    if row["outputs_equal"]:
        return "yes"
    return "NO: prompts " + ", ".join(map(str, row["mismatched_prompts"] or []))


def markdown_table(results: LoadSweepResults) -> str:
    """The sweep as a markdown table, one row per level."""
    base = results["baseline_clients"]
    lines = [
        f"| clients | tokens/s | × {'one client' if base == 1 else f'{base} clients'} | "
        "req/s | p50 latency s | p90 | TTFT p50 | peak RSS MB | errors | outputs equal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["table"]:
        lines.append(
            f"| {row['clients']} | {_cell(row['tokens_per_s'], '.1f')} | "
            f"{_cell(row['speedup_vs_one_client'], '.2f')} | "
            f"{_cell(row['requests_per_s'], '.2f')} | {_cell(row['latency_p50_s'], '.2f')} | "
            f"{_cell(row['latency_p90_s'], '.2f')} | {_cell(row['ttft_p50_s'], '.2f')} | "
            f"{_cell(row['peak_rss_mb'], '.0f')} | {row['errors']} | {_equal_cell(row)} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: LoadSweepResults, path: Path) -> Path:
    """Throughput over the lowest level's, and p50 latency, against clients (PNG, atomic)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def figures(key: Literal["speedup_vs_one_client", "latency_p50_s"]) -> list[float]:
        # a level without the figure: a gap in the line
        return [math.nan if (value := row[key]) is None else value for row in rows]

    rows = results["table"]
    clients = [row["clients"] for row in rows]
    base = results["baseline_clients"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.0))
    left.plot(clients, [c / base for c in clients], color="grey", linestyle="--", label="linear")
    left.plot(clients, figures("speedup_vs_one_client"), marker="o", label="measured")
    left.set(
        xlabel="concurrent clients",
        ylabel=f"tokens/s over {base} client{'s' if base > 1 else ''}",
        title="throughput",
    )
    left.legend()
    right.plot(clients, figures("latency_p50_s"), marker="o")
    right.set(xlabel="concurrent clients", ylabel="p50 latency (s)", title="latency")
    for axes in (left, right):
        axes.set_xscale("log", base=2)
        axes.set_xticks(clients, [str(c) for c in clients])
        axes.grid(alpha=0.3)
    settings = results["settings"]
    figure.suptitle(
        f"specops loadtest: {settings['requests']} requests per level, "
        f"max_tokens {settings['max_tokens']}, temperature {settings['temperature']:g}"
    )
    figure.tight_layout()
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=110, format="png")
    plt.close(figure)
    return path


def write_report(results: LoadSweepResults, out: Path) -> dict[str, Path]:
    """Write ``out`` (JSON) and, beside it, the table (``.md``) and the plot (``.png``)."""
    out = Path(out)
    written = {"json": out, "table": out.with_suffix(".md"), "plot": out.with_suffix(".png")}
    write_json_atomic(written["json"], results)
    write_text_atomic(written["table"], markdown_table(results))
    plot(results, written["plot"])
    return written
