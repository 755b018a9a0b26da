"""The quality run's report (``quality.json`` as :func:`tasks.bench.quality.run_quality`
writes it): a text table per target and the plot ``quality.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.atomic import atomic_path
from serving.errors import BadInputError


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def format_table(payload: dict[str, Any]) -> str:
    """One row per target: pass@1 with its interval, agreement with the reference, speed."""
    reference = payload["reference"]
    lines = [
        f"{'target':<14} {'kernels':<7} {'pass@1':>13} {'95% CI':>15} {'exact':>7} "
        f"{'prefix':>7} {'top-1 TF':>9} {'tok/s':>6}"
    ]
    for name, r in payload["targets"].items():
        p = r["pass_at_1"]
        a = r["agreement"]["all"]
        low, high = p["ci95"]
        is_ref = name == reference
        lines.append(
            f"{name:<14} {r['kernels']:<7} "
            f"{p['passed']:>3}/{p['problems']:<3} {_pct(p['rate']):>6} "
            f"{f'[{100 * low:.1f}, {100 * high:.1f}]':>15} "
            f"{'ref' if is_ref else _pct(a['exact_match']):>7} "
            f"{'ref' if is_ref else _pct(a['prefix_fraction']):>7} "
            f"{_pct(a['teacher_forced']):>9} "
            f"{r['timing']['tokens_per_s'] or 0:>6.1f}"
        )
    lines.append(
        f"agreement with {reference}'s greedy output over {len(payload['prompts'])} prompts "
        f"({len(payload['problems'])} HumanEval, the rest ShareGPT); top-1 TF: teacher-forced "
        f"on {reference}'s output ({reference}'s own row: one pass against its own decoding)"
    )
    return "\n".join(lines)


def report(out_dir: Path) -> dict[str, Any]:
    """``out_dir/quality.json`` as written by :func:`run_quality`, its plot redrawn."""
    import json

    path = Path(out_dir) / "quality.json"
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise BadInputError(f"cannot read {str(path)!r}: {error}") from None
    plot(payload, path.with_suffix(".png"))
    return payload


def plot(payload: dict[str, Any], path: Path) -> Path:
    """pass@1 with its Wilson interval, and teacher-forced agreement, per target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(payload["targets"])
    results = [payload["targets"][n] for n in names]
    rates = [r["pass_at_1"]["rate"] or 0.0 for r in results]
    errors = [
        [
            max(0.0, rate - r["pass_at_1"]["ci95"][0])
            for rate, r in zip(rates, results, strict=True)
        ],
        [
            max(0.0, r["pass_at_1"]["ci95"][1] - rate)
            for rate, r in zip(rates, results, strict=True)
        ],
    ]
    agreement = [r["agreement"]["all"]["teacher_forced"] or 0.0 for r in results]
    exact = [r["agreement"]["all"]["exact_match"] or 0.0 for r in results]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    positions = range(len(names))
    left.bar(positions, rates, yerr=errors, capsize=6, color="tab:blue")
    left.set_xticks(positions, names)
    left.set(
        ylabel="pass@1 (greedy, executed)",
        ylim=(0, max(0.05, *(r["pass_at_1"]["ci95"][1] for r in results)) * 1.1),
        title=f"HumanEval held-out, {len(payload['problems'])} problems (Wilson 95%)",
    )
    width = 0.38
    tf_bars = right.bar(
        [p - width / 2 for p in positions], agreement, width, label="teacher-forced top-1"
    )
    exact_bars = right.bar(
        [p + width / 2 for p in positions], exact, width, label="whole output identical"
    )
    for bars in (tf_bars, exact_bars):
        right.bar_label(bars, fmt="%.3f", fontsize=7)
    right.set_xticks(positions, names)
    right.set(
        ylim=(0, 1.2),
        ylabel=f"agreement with {payload['reference']}",
        title=f"{len(payload['prompts'])} prompts, greedy, {payload['config']['max_new_tokens']}"
        " new tokens at most",
    )
    right.legend(loc="upper center", ncol=2, fontsize=8)
    for axes in (left, right):
        axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    with atomic_path(path) as scratch:
        figure.savefig(scratch, dpi=110, format="png")
    plt.close(figure)
    return path
