"""Several ``specops bench`` runs of one config as one table: each (workload, method)'s
median tokens/s and ratio to llama.cpp plain, with the spread (min–max) over the runs.

``python -m tasks.bench.repeats RUN_DIR... --out FILE.json`` prints a Markdown table and
writes the combined results; every run must come from the same config. ``--against
METHOD`` adds each row's ratio to METHOD's tokens/s on the same workload in the same run
(median, min–max over the runs): the speedup over plain decoding, say, or over the best
n-gram drafter, with each run's own noise cancelled where both ran interleaved.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from serving.atomic import write_json_atomic
from serving.errors import BadInputError
from tasks.bench.bench_report import sum_by_stage


def _load(folder: Path) -> dict:
    path = folder / "bench.json" if folder.is_dir() else folder
    if not path.is_file():
        raise BadInputError(f"no bench results at {path}")
    return json.loads(path.read_text())


def combine(runs: list[dict], against: str | None = None) -> list[dict]:
    """One row per (workload, method) in the first run's order; with ``against``, each
    row's per-run ratio to that method's tokens/s on the same workload."""
    if not runs:
        raise BadInputError("no runs to combine")
    methods = [m["name"] for m in runs[0]["config"]["methods"]]
    if against is not None and against not in methods:
        raise BadInputError(f"--against {against!r} is not a method of the runs: {methods}")
    for run in runs[1:]:
        if [m["name"] for m in run["config"]["methods"]] != methods:
            raise BadInputError("the runs come from different bench configs")
    cells: dict[tuple[str, str], list[dict]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        speed = {(r["workload"], r["method"]): r["tokens_per_s"] for r in run["summary"]}
        for row in run["summary"]:
            cell = (row["workload"], row["method"])
            cells.setdefault(cell, []).append(row)
            base = speed.get((row["workload"], against)) if against else None
            if base and row["tokens_per_s"]:
                ratios.setdefault(cell, []).append(row["tokens_per_s"] / base)
    combined = []
    for (workload, method), rows in cells.items():
        speeds = [r["tokens_per_s"] for r in rows]
        x_llama = [r["x_llama"] for r in rows if r.get("x_llama") is not None]
        combined.append(
            {
                "workload": workload,
                "method": method,
                "runs": len(rows),
                "tokens_per_s": statistics.median(speeds),
                "tokens_per_s_min": min(speeds),
                "tokens_per_s_max": max(speeds),
                "x_llama": statistics.median(x_llama) if x_llama else None,
                "x_llama_min": min(x_llama) if x_llama else None,
                "x_llama_max": max(x_llama) if x_llama else None,
                "identical": all(r["identical"] for r in rows),
                "acceptance_rate": rows[0].get("acceptance_rate"),
                "mean_accepted_length": rows[0].get("mean_accepted_length"),
                "accepted_by_stage": sum_by_stage(rows),
                **_ratio_fields(against, ratios.get((workload, method), [])),
            }
        )
    return combined


def _ratio_fields(against: str | None, values: list[float]) -> dict[str, object]:
    if against is None:
        return {}
    return {
        "against": against,
        "x_against": statistics.median(values) if values else None,
        "x_against_min": min(values) if values else None,
        "x_against_max": max(values) if values else None,
    }


def _spread(row: dict, key: str) -> str:
    if row.get(key) is None:
        return "—"
    return f"{row[key]:.2f} ({row[key + '_min']:.2f}–{row[key + '_max']:.2f})"


def table(rows: list[dict]) -> str:
    against = next((r["against"] for r in rows if r.get("against")), None)
    extra = f" × {against} |" if against else ""
    lines = [
        "| workload | method | tokens/s (median, min–max) | × llama.cpp plain |"
        f"{extra} identical to its reference |",
        "|---|---|---:|---:|" + ("---:|" if against else "") + "---|",
    ]
    for r in rows:
        ratio = f" {_spread(r, 'x_against')} |" if against else ""
        lines.append(
            f"| {r['workload']} | {r['method']} | {r['tokens_per_s']:.1f} "
            f"({r['tokens_per_s_min']:.1f}–{r['tokens_per_s_max']:.1f}) | "
            f"{_spread(r, 'x_llama')} |{ratio} {'yes' if r['identical'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--against", help="Also each row's ratio to this method's tokens/s.")
    args = parser.parse_args(argv)
    runs = [_load(folder) for folder in args.runs]
    rows = combine(runs, args.against)
    environment = runs[0].get("environment", {})
    write_json_atomic(
        args.out, {"runs": [str(r) for r in args.runs], "environment": environment, "summary": rows}
    )
    print(table(rows))


if __name__ == "__main__":
    main()
