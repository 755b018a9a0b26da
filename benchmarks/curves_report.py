"""The learning-curve report: every design's points side by side, as a table and a plot.

Reads ``<out_dir>/<design>/points.json`` (written by :mod:`benchmarks.draft_curves`) and, when
present, ``<out_dir>/speed.json`` (the wall-clock check through the engine); writes
``curves.json``, ``curves.md`` and ``curves.png`` beside them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serving.atomic import atomic_writer, write_json_atomic

# The files of a curves run (the harness, benchmarks.draft_curves, writes them).
POINTS_FILE = "points.json"  # <out_dir>/<design>/
SPEED_FILE = "speed.json"  # <out_dir>/


def collect(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Design name -> its points payload, for every design scored under ``out_dir``."""
    designs = {}
    for path in sorted(Path(out_dir).glob(f"*/{POINTS_FILE}")):
        payload = json.loads(path.read_text())
        if payload.get("points"):
            designs[payload["design"]] = payload
    return designs


def _cell(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def table(designs: dict[str, dict[str, Any]], speed: dict[str, Any] | None) -> str:
    """Markdown: one row per design and mark, then the wall-clock check if there is one."""
    lines = [
        "| design | minutes | steps | trained tokens | agreement | mean accepted length |",
        "|---|---|---|---|---|---|",
    ]
    for name, payload in designs.items():
        for point in payload["points"]:
            lines.append(
                f"| {name} | {point['minutes']:.1f} | {point['steps']} | "
                f"{point['train_tokens']:,} | {_cell(point['agreement'], '.3f')} | "
                f"{_cell(point['mean_accepted_length'], '.3f')} |"
            )
    if speed:
        lines += [
            "",
            f"Wall clock through the engine: {speed['prompts']} held-out prompts x "
            f"{speed['max_new_tokens']} tokens, designs with k = {speed['k']} drafts per "
            f"step, {speed['threads']} threads, "
            f"on {speed['hardware']} (plain decoding: "
            f"{_cell(speed['results']['plain']['tokens_per_s'], '.1f')} tok/s).",
            "",
            "| design | acceptance | mean accepted length | speedup | lossless |",
            "|---|---|---|---|---|",
        ]
        for name, result in speed["results"].items():
            if name == "plain":
                continue
            lines.append(
                f"| {name} | {_cell(result['acceptance_rate'], '.3f')} | "
                f"{_cell(result['mean_accepted_length'], '.2f')} | "
                f"{_cell(result['speedup'], '.2f')}x | {'yes' if result['lossless'] else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def plot(designs: dict[str, dict[str, Any]], path: Path, *, goal: float | None = None) -> Path:
    """Mean accepted length against training minutes, agreement against trained tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, payload in designs.items():
        points = payload["points"]
        minutes = [p["minutes"] for p in points]
        left.plot(minutes, [p["mean_accepted_length"] for p in points], marker="o", label=name)
        tokens = [p["train_tokens"] / 1e6 for p in points]
        right.plot(tokens, [p["agreement"] for p in points], marker="o", label=name)
    k = next(iter(designs.values()))["k"] if designs else 2
    left.axhline(1.0, color="grey", linewidth=0.8)
    if goal is not None:
        left.axhline(goal, color="grey", linestyle="--", linewidth=0.8, label=f"goal {goal}")
    left.set(
        xlabel="training minutes (optimiser steps only)",
        ylabel=f"mean accepted length, k = {k}",
        title="held-out ShareGPT, replayed greedy",
    )
    right.set(
        xlabel="trained tokens (millions, with repeats)",
        ylabel="top-1 agreement with the target",
        title="held-out ShareGPT answers",
    )
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(scratch, dpi=110)
    plt.close(figure)
    scratch.replace(path)
    return path


def write_report(out_dir: Path, *, goal: float | None = None) -> dict[str, Path]:
    """Write ``curves.json``, ``curves.md`` and ``curves.png`` for what ``out_dir`` holds."""
    out_dir = Path(out_dir)
    designs = collect(out_dir)
    speed_path = out_dir / SPEED_FILE
    speed = json.loads(speed_path.read_text()) if speed_path.is_file() else None
    written = {"json": out_dir / "curves.json", "table": out_dir / "curves.md"}
    write_json_atomic(written["json"], {"designs": designs, "speed": speed})
    with atomic_writer(written["table"]) as handle:
        handle.write(table(designs, speed))
    if designs:
        written["plot"] = plot(designs, out_dir / "curves.png", goal=goal)
    return written
