"""A scale sweep: one scenario over the number of draft clients and of targets.

A point ``(drafts, targets)`` is the scenario with

- **drafts**: closed-loop arrivals get ``clients = drafts`` (N draft devices, each sending
  its next request ``think_s`` after its previous answer); Poisson arrivals are read as
  one draft client's and get ``rate_per_s * drafts`` (N independent Poisson clients are
  one Poisson stream N times as fast). A trace has no client count and is refused.
- **targets**: every ``targets`` entry gets ``count = targets`` (one device kind: that
  many servers; several kinds: that many of each). Without a targets list the scenario's
  counts stay.

Each point runs once (its scenario's seed) and is summarised without the per-server
section. :func:`run_sweep` writes ``sweep.json`` (settings, table, every point's report),
``sweep.md`` (the table) and ``sweep.png`` (throughput, p50 and p90 latency, p50 TTFT,
goodput within the SLO and batch utilisation against drafts, one line per target count).
:func:`log_sweep` records it as one MLflow run with a nested run per point, through a
``log_report`` callable (``registry.client.Registry.log_report``: only ``registry/``
talks to MLflow).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TypeAlias, TypedDict

from serving.atomic import atomic_path, write_json_atomic, write_text_atomic
from serving.errors import BadInputError
from tasks.json_types import JsonObject
from tasks.simulate.config import ClosedArrivals, PoissonArrivals, Scenario
from tasks.simulate.model import simulate
from tasks.simulate.report import ReportLogger, SimReport, summarise


class SweepRow(TypedDict):
    """One point's figures for the table, plot and MLflow (``None`` where none)."""

    drafts: int
    targets: int
    requests: int
    unfinished: int
    throughput_tokens_per_s: float
    latency_p50_s: float | None
    latency_p90_s: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    tpot_p50_s: float | None
    goodput_requests_per_s: float
    batch_utilisation: float
    rows_utilisation: float
    busy: float
    wall_s: float


# A key of :class:`SweepRow`, as the table, the plot and the metrics name them.
SweepColumn: TypeAlias = Literal[
    "drafts",
    "targets",
    "requests",
    "unfinished",
    "throughput_tokens_per_s",
    "latency_p50_s",
    "latency_p90_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "tpot_p50_s",
    "goodput_requests_per_s",
    "batch_utilisation",
    "rows_utilisation",
    "busy",
    "wall_s",
]


class SweepPointReport(SimReport):
    """One point's report (without the per-server section), with the point."""

    drafts: int
    targets: int


class SweepPayload(TypedDict):
    """What ``sweep.json`` holds."""

    config: str | None
    drafts: list[int]
    targets: list[int] | None
    scaling: str
    scenario: JsonObject  # the base scenario, as JSON
    table: list[SweepRow]
    reports: list[SweepPointReport]


SWEEP_KEYS = ("drafts",)
# the table's columns: (key, heading, format)
COLUMNS: tuple[tuple[SweepColumn, str, str], ...] = (
    ("drafts", "drafts", "d"),
    ("targets", "targets", "d"),
    ("requests", "requests", "d"),
    ("throughput_tokens_per_s", "tokens/s", ".1f"),
    ("latency_p50_s", "latency p50 s", ".2f"),
    ("latency_p90_s", "p90", ".2f"),
    ("ttft_p50_s", "TTFT p50 s", ".2f"),
    ("ttft_p90_s", "p90", ".2f"),
    ("goodput_requests_per_s", "goodput req/s", ".3f"),
    ("batch_utilisation", "batch util.", ".2f"),
    ("busy", "busy", ".2f"),
    ("unfinished", "unfinished", "d"),
    ("wall_s", "wall s", ".1f"),
)


def parse_counts(text: str, *, name: str) -> list[int]:
    """``"1,10,100"`` as ``[1, 10, 100]``: integers >= 1, no repeats."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BadInputError(f"{name}: {text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise BadInputError(f"{name}: {text!r} must list distinct integers >= 1, e.g. 1,10,100")
    return values


def parse_sweep(text: str) -> list[int]:
    """``--sweep drafts=1,10,100`` as the list of draft counts."""
    key, sep, values = text.partition("=")
    if not sep or key.strip() not in SWEEP_KEYS:
        raise BadInputError(
            f"--sweep: {text!r} is not KEY=V1,V2,...; KEY is one of {', '.join(SWEEP_KEYS)} "
            "(targets go in --targets)"
        )
    return parse_counts(values, name=f"--sweep {key.strip()}")


def point_scenario(base: Scenario, drafts: int, targets: int | None) -> Scenario:
    """``base`` at one sweep point (see the module docstring for how each axis scales)."""
    arrivals = base.arrivals
    if isinstance(arrivals, ClosedArrivals):
        arrivals = arrivals.model_copy(update={"clients": drafts})
    elif isinstance(arrivals, PoissonArrivals):
        arrivals = arrivals.model_copy(update={"rate_per_s": arrivals.rate_per_s * drafts})
    else:
        raise BadInputError(
            f"arrivals.kind: a sweep over drafts needs closed or poisson arrivals, not "
            f"{arrivals.kind!r} (a trace has no client count to scale)"
        )
    update: dict[str, object] = {"arrivals": arrivals}
    if targets is not None:
        update["targets"] = [t.model_copy(update={"count": targets}) for t in base.targets]
    return base.model_copy(update=update)


def table_row(drafts: int, targets: int, report: SimReport, wall_s: float) -> SweepRow:
    """One point's figures for the table, plot and MLflow (``None`` where none)."""
    return {
        "drafts": drafts,
        "targets": targets,
        "requests": report["requests"],
        "unfinished": report["unfinished"],
        "throughput_tokens_per_s": report["throughput_tokens_per_s"],
        "latency_p50_s": report["latency_s"]["p50"],
        "latency_p90_s": report["latency_s"]["p90"],
        "ttft_p50_s": report["ttft_s"]["p50"],
        "ttft_p90_s": report["ttft_s"]["p90"],
        "tpot_p50_s": report["tpot_s"]["p50"],
        "goodput_requests_per_s": report["goodput_requests_per_s"],
        "batch_utilisation": report["batch_utilisation"],
        "rows_utilisation": report["rows_utilisation"],
        "busy": report["busy"],
        "wall_s": wall_s,
    }


def run_sweep(
    base: Scenario,
    drafts: Sequence[int],
    targets: Sequence[int] | None,
    out: str | Path,
    *,
    config: str | None = None,
    progress: bool = True,
) -> SweepPayload:
    """Run every point (targets outer, drafts inner); write ``sweep.json``, ``sweep.md``
    and ``sweep.png`` under ``out``; return what ``sweep.json`` holds."""
    from tqdm.auto import tqdm

    target_axis: list[int | None] = list(targets) if targets else [None]
    # every point is built (and a bad axis refused) before any runs
    scenarios = [(d, t, point_scenario(base, d, t)) for t in target_axis for d in drafts]
    rows: list[SweepRow] = []
    reports: list[SweepPointReport] = []
    bar = tqdm(total=len(scenarios), desc="simulate sweep", unit="point", disable=not progress)
    try:
        for d, t, scenario in scenarios:
            count = t if t is not None else sum(device.count for device in base.targets)
            bar.set_postfix(drafts=d, targets=count)
            started = time.perf_counter()
            report = summarise(simulate(scenario), per_server=False)
            wall = time.perf_counter() - started
            rows.append(table_row(d, count, report, wall))
            reports.append({"drafts": d, "targets": count, **report})
            bar.update()
    finally:
        bar.close()
    payload: SweepPayload = {
        "config": config,
        "drafts": list(drafts),
        "targets": list(targets) if targets else None,
        "scaling": _scaling(base),
        "scenario": base.model_dump(mode="json"),
        "table": rows,
        "reports": reports,
    }
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "sweep.json", payload)
    write_text_atomic(folder / "sweep.md", markdown_table(rows))
    plot(payload, folder / "sweep.png")
    return payload


def _scaling(base: Scenario) -> str:
    if isinstance(base.arrivals, PoissonArrivals):
        return f"drafts = Poisson clients of {base.arrivals.rate_per_s:g} requests/s each"
    return "drafts = closed-loop clients"


def _cell(value: object, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown_table(rows: Sequence[SweepRow]) -> str:
    """The sweep's table, one row per point."""
    lines = [
        "| " + " | ".join(heading for _, heading, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[k], spec) for k, _, spec in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


# (key, title, log y): latencies span orders of magnitude once the targets saturate
PANELS: tuple[tuple[SweepColumn, str, bool], ...] = (
    ("throughput_tokens_per_s", "throughput (tokens/s)", False),
    ("latency_p50_s", "p50 latency (s)", True),
    ("latency_p90_s", "p90 latency (s)", True),
    ("ttft_p50_s", "p50 TTFT (s)", True),
    ("goodput_requests_per_s", "goodput within SLO (requests/s)", False),
    ("batch_utilisation", "batch utilisation", False),
)


def plot(payload: SweepPayload, path: Path) -> Path:
    """Each panel against drafts (log scale), one line per target count (PNG, atomic)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = payload["table"]
    drafts = sorted({row["drafts"] for row in rows})
    figure, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    for (key, title, log_y), ax in zip(PANELS, axes.flat, strict=True):
        for count in sorted({row["targets"] for row in rows}):
            line = [row for row in rows if row["targets"] == count]
            values = [math.nan if (value := row[key]) is None else value for row in line]
            label = f"{count} target{'s' if count > 1 else ''}"
            ax.plot([row["drafts"] for row in line], values, marker="o", label=label)
        ax.set(xlabel="draft clients", title=title)
        ax.set_xscale("log")
        ax.set_xticks(drafts, [str(d) for d in drafts])
        ax.minorticks_off()
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
    axes.flat[0].legend()
    scenario = payload["scenario"]
    figure.suptitle(
        f"specops simulate sweep: {payload['scaling']}; {scenario['mode']}, "
        f"router {scenario['router']}, {scenario['duration_s']:g} s simulated, "
        f"SLO {scenario['slo_s']:g} s"
    )
    figure.tight_layout()
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=100, format="png")
    plt.close(figure)
    return path


METRICS: tuple[SweepColumn, ...] = (
    *(key for key, _, _ in COLUMNS[2:]),
    "tpot_p50_s",
    "rows_utilisation",
)


def log_sweep(log_report: ReportLogger, payload: SweepPayload, folder: str | Path) -> str:
    """One parent run holding the sweep's files, and one nested run per point with its
    figures (``mlflow.parentRunId``); return the parent's id."""
    folder = Path(folder)
    name = Path(payload["config"] or "scenario").stem
    files = [folder / "sweep.json", folder / "sweep.md", folder / "sweep.png"]
    parent = log_report(
        f"simulate-sweep-{name}",
        files,
        metrics={"points": float(len(payload["table"]))},
        tags={
            "kind": "simulation-sweep",
            "config": str(payload["config"]),
            "drafts": ",".join(map(str, payload["drafts"])),
            "targets": ",".join(map(str, payload["targets"] or [])),
            "scaling": payload["scaling"],
        },
    )
    for row in payload["table"]:
        log_report(
            f"drafts={row['drafts']} targets={row['targets']}",
            [],
            metrics={k: float(value) for k in METRICS if (value := row[k]) is not None},
            tags={
                "kind": "simulation",
                "mlflow.parentRunId": parent,
                "drafts": str(row["drafts"]),
                "targets": str(row["targets"]),
            },
        )
    return parent
