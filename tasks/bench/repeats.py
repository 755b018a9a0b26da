"""Several ``specops bench`` runs of one config as one table: each (workload, method)'s
median tokens/s and ratio to llama.cpp plain, with the spread (min–max) over the runs.

``python -m tasks.bench.repeats RUN_DIR... --out FILE.json`` prints a Markdown table and
writes the combined results; every run must come from the same config.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from serving.atomic import write_json_atomic
from serving.errors import BadInputError


def _load(folder: Path) -> dict:
    path = folder / "bench.json" if folder.is_dir() else folder
    if not path.is_file():
        raise BadInputError(f"no bench results at {path}")
    return json.loads(path.read_text())


def combine(runs: list[dict]) -> list[dict]:
    """One row per (workload, method) in the first run's order."""
    if not runs:
        raise BadInputError("no runs to combine")
    methods = [m["name"] for m in runs[0]["config"]["methods"]]
    for run in runs[1:]:
        if [m["name"] for m in run["config"]["methods"]] != methods:
            raise BadInputError("the runs come from different bench configs")
    cells: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        for row in run["summary"]:
            cells.setdefault((row["workload"], row["method"]), []).append(row)
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
            }
        )
    return combined


def table(rows: list[dict]) -> str:
    lines = [
        "| workload | method | tokens/s (median, min–max) | × llama.cpp plain "
        "| identical to its reference |",
        "|---|---|---:|---:|---|",
    ]
    for r in rows:
        ratio = (
            f"{r['x_llama']:.2f} ({r['x_llama_min']:.2f}–{r['x_llama_max']:.2f})"
            if r["x_llama"] is not None
            else "—"
        )
        lines.append(
            f"| {r['workload']} | {r['method']} | {r['tokens_per_s']:.1f} "
            f"({r['tokens_per_s_min']:.1f}–{r['tokens_per_s_max']:.1f}) | {ratio} | "
            f"{'yes' if r['identical'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    runs = [_load(folder) for folder in args.runs]
    rows = combine(runs)
    environment = runs[0].get("environment", {})
    write_json_atomic(
        args.out, {"runs": [str(r) for r in args.runs], "environment": environment, "summary": rows}
    )
    print(table(rows))


if __name__ == "__main__":
    main()
