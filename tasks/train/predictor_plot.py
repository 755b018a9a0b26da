"""The acceptance predictor's reliability diagram: predicted vs observed acceptance per
probability bin, one line per drafter stage and one for all rows (the predictor as it
serves, shrunk), the raw MLP's overall line dashed beside it for the shrinkage ablation."""

from __future__ import annotations

from pathlib import Path

from serving.atomic import atomic_path
from tasks.train.predictor_metrics import ALL, RAW, SHRUNK, PredictorEvaluation


def write_reliability_plot(evaluation: PredictorEvaluation, path: str | Path) -> Path:
    """Draw the diagram of ``evaluation`` into the PNG ``path`` (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 5.0))
    ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle=":", label="calibrated")
    lines = [(ALL, SHRUNK), (ALL, RAW), *((stage, SHRUNK) for stage in evaluation.stages())]
    for group, variant in lines:
        scores = evaluation.groups[group][variant]
        label = f"{group} ({'raw MLP' if variant == RAW else 'shrunk'}), ECE {scores.ece:.3f}"
        ax.plot(
            [b.predicted for b in scores.bins],
            [b.observed for b in scores.bins],
            marker="o",
            markersize=3,
            linewidth=2.0 if group == ALL else 1.2,
            linestyle="--" if variant == RAW else "-",
            color=("dimgray" if variant == RAW else "black") if group == ALL else None,
            label=label,
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted acceptance (mean in bin)")
    ax.set_ylabel("observed acceptance")
    rows = evaluation.overall.rows
    ax.set_title(f"acceptance predictor, {evaluation.hardware}: {rows} held-out tokens")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=120, format="png")
    plt.close(fig)
    return Path(path)
