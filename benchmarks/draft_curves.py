"""Learning curves of the trainable draft designs: which one pays on this hardware, and when.

Each design of ``benchmarks/configs/draft_curves.yaml`` (a draft head, a head over a reduced
vocabulary, LoRA on the target's first layers, a full fine-tune of them) trains on the same
teacher cache with the same thread count. Training stops at each time mark (minutes spent
in optimiser steps: loading, evaluation and checkpoints are not counted), the draft is
scored on a held-out teacher cache, and training resumes from its checkpoint to the next
mark. Scores per mark (see :mod:`tasks.evaluate.offline_acceptance`): top-1 agreement with the
target's own greedy output, and the mean accepted length with ``k`` greedy drafts per step.

Everything lands under ``out_dir``: ``<design>/work`` (checkpoints, the draft),
``<design>/points.json`` (one point per finished mark, rewritten atomically). A killed run
re-run with the same settings skips finished marks and resumes the one in flight. Then a
wall-clock check of each design's last draft through the engine (:func:`speed`) and the
report (:mod:`benchmarks.curves_report`). Run it from the repository root as
``python -m benchmarks.draft_curves --help`` (docs/learning-curves.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from benchmarks.cli import run_study
from benchmarks.curves_report import POINTS_FILE, SPEED_FILE, collect, write_report
from serving.atomic import write_json_atomic
from serving.engine.drafters.plan import DEFAULT_K, DEFAULT_POLICY
from serving.errors import BadInputError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from serving.target import LoadedTarget

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "draft_curves.yaml"
WORK_DIR = "work"
_NO_STEP_LIMIT = 10**9  # designs stop on time, not on steps


class Design(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["head", "lora", "full"]
    description: str = ""
    # Settings of TrainHeadConfig (head) or DistillConfig (lora, full), checked on load.
    settings: dict[str, Any] = Field(default_factory=dict)


class CurvesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    marks_minutes: list[float]  # where each curve is scored, increasing
    k: int = Field(default=2, ge=1)  # drafts per step in the replayed mean accepted length
    threads: int = Field(default=1, ge=1)
    designs: dict[str, Design]

    @field_validator("marks_minutes")
    @classmethod
    def _increasing(cls, marks: list[float]) -> list[float]:
        if not marks or any(m <= 0 for m in marks) or sorted(set(marks)) != marks:
            raise ValueError(f"marks_minutes must be positive and increasing, got {marks}")
        return marks

    @field_validator("designs")
    @classmethod
    def _some(cls, designs: dict[str, Design]) -> dict[str, Design]:
        if not designs:
            raise ValueError("name at least one design")
        return designs


def load_curves_config(path: Path = DEFAULT_CONFIG) -> CurvesConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise BadInputError(f"cannot read draft-curves config {str(path)!r}: {error}") from None
    try:
        return CurvesConfig.model_validate(raw)
    except ValidationError as error:
        raise BadInputError(f"invalid draft-curves config {str(path)!r}:\n{error}") from None


@dataclass(frozen=True)
class CurvePoint:
    minutes: float  # training time at this point (>= the mark it stopped at)
    steps: int
    train_tokens: int  # positions trained on (with repeats: epochs count)
    agreement: float | None  # held-out top-1 agreement of the first draft
    mean_accepted_length: float | None  # replayed with k drafts per step
    heldout_positions: int


# ------------------------------------------------------------------------- the designs


def trainer_config(name: str, design: Design, teacher_dir: Path, work: Path):
    """The design's trainer config, stopping on time only; a bad setting names the design."""
    from tasks.train.distill import DistillConfig
    from tasks.train.train_head import TrainHeadConfig

    fixed = {
        "teacher_dir": teacher_dir,
        "output_dir": work,
        "max_steps": _NO_STEP_LIMIT,
        "eval_every": _NO_STEP_LIMIT,  # the curve scores each mark itself
    }
    try:
        if design.kind == "head":
            return TrainHeadConfig(**{**design.settings, **fixed})
        return DistillConfig(**{**design.settings, **fixed, "kind": design.kind})
    except ValidationError as error:
        raise BadInputError(f"design {name!r} has bad settings:\n{error}") from None


def _train(config, target: LoadedTarget, budget_s: float, progress: bool):
    from tasks.train.distill import DistillConfig, distill
    from tasks.train.train_head import train_head

    if isinstance(config, DistillConfig):
        distilled = distill(
            config,
            target.model,
            tokenizer=target.tokenizer,
            progress=progress,
            max_train_seconds=budget_s,
        )
        return distilled, distilled.model_dir
    trained = train_head(config, target.model, progress=progress, max_train_seconds=budget_s)
    return trained, trained.head_dir


def _hits_of(kind: str, draft_dir: Path, target: PreTrainedModel, k: int) -> Callable:
    """A function giving the hits of the trained draft on one held-out sequence."""
    from tasks.evaluate.offline_acceptance import head_hits, model_hits

    if kind == "head":
        from serving.models.head import load_head
        from tasks.train.head_loss import frozen_target

        head = load_head(draft_dir, target)
        frozen = frozen_target(target, head.vocab_ids)
        return lambda sequence: head_hits(head, sequence, frozen, depths=k)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    return lambda sequence: model_hits(model, sequence, k)


def score(
    kind: str, draft_dir: Path, target: PreTrainedModel, heldout: list, k: int
) -> dict[str, Any]:
    from tasks.evaluate.offline_acceptance import replay_all

    total = replay_all(_hits_of(kind, draft_dir, target, k), heldout, k)
    return {
        "agreement": total.agreement,
        "mean_accepted_length": total.mean_accepted_length,
        "heldout_positions": total.scored,
    }


# ------------------------------------------------------------------------------- runs


def read_points(path: Path) -> list[CurvePoint]:
    if not path.is_file():
        return []
    try:
        payload = json.loads(path.read_text())
        return [CurvePoint(**point) for point in payload["points"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInputError(f"{path} is corrupt ({exc}); delete it to score again") from exc


def run_design(
    name: str,
    design: Design,
    config: CurvesConfig,
    *,
    target: LoadedTarget,
    teacher_dir: Path,
    heldout: list,
    out_dir: Path,
    max_minutes: float | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> list[CurvePoint]:
    """Train ``design`` for ``target`` to each mark (up to ``max_minutes``), scoring it at
    each."""
    folder = out_dir / name
    work = folder / WORK_DIR
    trainer = trainer_config(name, design, teacher_dir, work)
    points = read_points(folder / POINTS_FILE)
    marks = [m for m in config.marks_minutes if max_minutes is None or m <= max_minutes]
    for mark in marks:
        if any(p.minutes >= mark for p in points):
            continue
        started = time.perf_counter()
        result, draft_dir = _train(trainer, target, mark * 60.0, progress)
        scores = score(design.kind, draft_dir, target.model, heldout, config.k)
        point = CurvePoint(
            minutes=result.train_seconds / 60.0,
            steps=result.steps,
            train_tokens=result.train_tokens,
            **scores,
        )
        points.append(point)
        write_json_atomic(
            folder / POINTS_FILE,
            {
                "design": name,
                "kind": design.kind,
                "description": design.description,
                "settings": design.settings,
                "k": config.k,
                "threads": config.threads,
                "teacher_dir": str(teacher_dir),
                "draft_dir": str(draft_dir),
                "points": [asdict(p) for p in points],
            },
        )
        log(
            f"{name} @ {point.minutes:.1f} min: {point.steps} steps, "
            f"{point.train_tokens} tokens, agreement {_fmt(point.agreement)}, mean accepted "
            f"length (k={config.k}) {_fmt(point.mean_accepted_length)} "
            f"[{time.perf_counter() - started:.0f} s]"
        )
    return points


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def answer_sequences(heldout_dir: Path, target: PreTrainedModel) -> list:
    """The held-out teacher cache's sequences, checked to be this target's."""
    from tasks.train.head_data import split_sequences
    from tasks.train.teacher import load_teacher_data
    from tasks.train.train_head import check_target

    manifest, sequences = load_teacher_data(heldout_dir)
    check_target(manifest.target, target)
    sequences, _ = split_sequences(sequences, 0.0)
    return sequences


# ---------------------------------------------------------------------- wall clock


def package_design(name: str, payload: dict[str, Any], folder: Path, k: int) -> Path:
    """A draft package (policy ``fixed``, ``k`` drafts) of a scored design's latest draft."""
    from serving.engine.drafters.package import DraftManifest, write_package

    draft_dir = Path(payload["draft_dir"])
    if not draft_dir.is_dir():
        raise BadInputError(f"design {name!r}: its draft {draft_dir} is gone; run it again")
    inside = "head" if payload["kind"] == "head" else "weights"
    last = payload["points"][-1]
    manifest = DraftManifest(
        drafter=f"{'head' if inside == 'head' else 'model'}:{inside}",
        policy="fixed",
        k=k,
        family=payload["kind"],
        description=f"{name} after {last['minutes']:.1f} training minutes",
    )
    return write_package(folder, manifest, {inside: draft_dir})


def speed(
    out_dir: Path,
    *,
    target: LoadedTarget,
    k: int,
    prompts: int,
    max_new_tokens: int,
    threads: int,
    baselines: tuple[tuple[str, str, int], ...] = (("pld:3", DEFAULT_POLICY, DEFAULT_K),),
    seed: int = 0,
) -> dict[str, Any]:
    """Every scored design's latest draft (``k`` drafts per step) and each baseline
    (``(drafter, policy, k)``: by default prompt lookup as specops serves it) against plain
    decoding, interleaved, through the engine on ``target`` (on its hardware target) on
    held-out ShareGPT prompts; writes ``speed.json``."""
    from serving.engine.drafters.package import DraftManifest, write_package
    from tasks.data.traffic import build_workload
    from tasks.evaluate.evaluate import Contender, evaluate

    designs = collect(out_dir)
    if not designs:
        raise BadInputError(f"no scored design under {out_dir}; train the curves first")
    packages = out_dir / "packages"
    contenders = [
        Contender(name, package_design(name, payload, packages / name, k))
        for name, payload in designs.items()
    ]
    for spec, policy, baseline_k in baselines:
        manifest = DraftManifest(drafter=spec, policy=policy, k=baseline_k, family="ngram")
        folder = packages / spec.replace(":", "-")
        name = f"{spec} ({policy} policy, k <= {baseline_k})"
        contenders.append(Contender(name, write_package(folder, manifest)))
    chosen = build_workload("sharegpt", prompts, seed=seed, split="heldout")
    report = evaluate(contenders, chosen, target=target, max_new_tokens=max_new_tokens)
    report.update({"k": k, "threads": threads})
    write_json_atomic(out_dir / SPEED_FILE, report)
    return report


def main(argv: list[str] | None = None) -> int:
    from serving.target import DEFAULT_TARGET

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.draft_curves",
        description="Learning curves of the draft designs (mean accepted length and agreement "
        "against training minutes and tokens), then a wall-clock check of each design's last "
        "draft through the engine; writes curves.json, curves.md and curves.png under --out.",
    )
    parser.add_argument("--teacher", type=Path, default=Path("results/teacher/train"))
    parser.add_argument(
        "--heldout", type=Path, default=Path("results/teacher/heldout"), help="scoring cache"
    )
    parser.add_argument("--out", type=Path, default=Path("results/draft-curves"))
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="designs and marks")
    parser.add_argument("--designs", help="comma-separated designs to run (default: all)")
    parser.add_argument(
        "--max-minutes", type=float, help="stop every curve at this mark (default: all marks)"
    )
    parser.add_argument(
        "--speed-prompts",
        type=int,
        default=8,
        help="held-out prompts for the wall-clock check (0: skip it)",
    )
    parser.add_argument("--speed-tokens", type=int, default=128, help="tokens per prompt there")
    parser.add_argument("--speed-threads", type=int, default=2, help="torch threads there")
    parser.add_argument("--report-only", action="store_true", help="only redraw table and plot")
    parser.add_argument(
        "--speed-only",
        action="store_true",
        help="train nothing: only the wall-clock check and the report",
    )
    parser.add_argument(
        "--goal", type=float, default=1.6, help="mean accepted length drawn as the goal"
    )
    parser.add_argument(
        "--target", default=DEFAULT_TARGET, help="smollm2 or a local HF model folder"
    )
    args = parser.parse_args(argv)
    return run_study(lambda: _curves(args))


def _curves(args: argparse.Namespace) -> None:
    from serving.hardware import engine_target
    from serving.loader import load_target, set_threads

    settings = load_curves_config(args.config)
    chosen = list(settings.designs)
    if args.designs is not None:
        chosen = [d.strip() for d in args.designs.split(",") if d.strip()]
        unknown = [d for d in chosen if d not in settings.designs]
        if unknown or not chosen:
            raise BadInputError(
                f"unknown designs {unknown}; {args.config} has {list(settings.designs)}"
            )
    if args.speed_prompts < 0 or args.speed_tokens < 1:
        raise BadInputError("--speed-prompts must be >= 0 and --speed-tokens >= 1")
    if not (args.report_only or args.speed_only):
        set_threads(settings.threads)
        # Stock kernels: layers drafts copy the target's weights, which packed layers lack.
        trained = load_target(args.target, engine_target("cpu-stock"))
        sequences = answer_sequences(args.heldout, trained.model)
        for name in chosen:
            run_design(
                name,
                settings.designs[name],
                settings,
                target=trained,
                teacher_dir=args.teacher,
                heldout=sequences,
                out_dir=args.out,
                max_minutes=args.max_minutes,
            )
    if args.speed_prompts and not args.report_only:
        set_threads(args.speed_threads)
        speed(
            args.out,
            target=load_target(args.target),
            k=settings.k,
            prompts=args.speed_prompts,
            max_new_tokens=args.speed_tokens,
            threads=args.speed_threads,
        )
    written = write_report(args.out, goal=args.goal)
    print(written["table"].read_text())
    print(json.dumps({k: str(v) for k, v in written.items()}))


if __name__ == "__main__":
    sys.exit(main())
