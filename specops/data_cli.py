"""``specops data ...``: the data steps of the loop (each also a ``dvc.yaml`` stage), and
retention."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from specops.exit import fail
from specops.load import draft_plan, load_engine_target

data_app = typer.Typer(help="Traffic, failure-case collection, validation, acceptance.")


ParamsOption = Annotated[Path, typer.Option("--params", help="The pipeline's params file.")]


@data_app.command("build-traffic")
def build_traffic(
    params: ParamsOption = Path("params.yaml"),
    out: Annotated[Path, typer.Option(help="Folder for train.jsonl and heldout.jsonl.")] = Path(
        "pipeline/traffic"
    ),
) -> None:
    """Build the train and held-out prompts from real data (params: traffic)."""
    from serving.atomic import write_jsonl_atomic
    from serving.errors import SpecOpsError
    from serving.records.schema import Split
    from tasks.data.params import load_params
    from tasks.data.traffic import build_workload

    try:
        settings = load_params(params).traffic
        splits: list[tuple[Split, int]] = [
            ("train", settings.train_prompts_per_workload),
            ("heldout", settings.heldout_prompts_per_workload),
        ]
        for split, n in splits:
            prompts = [
                asdict(p)
                for workload in settings.workloads
                if n > 0
                for p in build_workload(workload, n, seed=settings.seed, split=split)
            ]
            count = write_jsonl_atomic(out / f"{split}.jsonl", prompts)
            typer.echo(f"{split}: {count} prompts -> {out / f'{split}.jsonl'}")
    except SpecOpsError as error:
        fail(str(error))


def _read_traffic(folder: Path):
    from serving.errors import BadInputError
    from serving.records.schema import SPLITS
    from tasks.data.prompts import Prompt

    prompts = []
    for split in SPLITS:
        path = folder / f"{split}.jsonl"
        if not path.is_file():
            raise BadInputError(f"traffic file {str(path)!r} is missing; run build-traffic")
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    prompts.append(Prompt(**json.loads(line)))
                except (json.JSONDecodeError, TypeError) as error:
                    raise BadInputError(f"{path}:{number}: not a prompt record ({error})") from None
    return prompts


def _hourly_run_id() -> str:
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H")


@data_app.command()
def collect(
    params: ParamsOption = Path("params.yaml"),
    traffic: Annotated[Path, typer.Option(help="Folder from build-traffic.")] = Path(
        "pipeline/traffic"
    ),
    store_root: Annotated[Path, typer.Option("--store", help="The record store.")] = Path("data"),
    run_id: Annotated[
        str | None, typer.Option(help="Collection id; re-running one skips what it wrote.")
    ] = None,
    summary: Annotated[Path | None, typer.Option(help="Write the summary JSON here.")] = None,
) -> None:
    """Run traffic through the engine in detailed mode; append records (params: collect)."""
    from serving.atomic import write_json_atomic
    from serving.engine.build import build_decoder
    from serving.engine.sampling import SamplingParams
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target
    from tasks.data.collect import collect as run_collect
    from tasks.data.params import load_params

    try:
        settings = load_params(params).collect
        prompts = _read_traffic(traffic)
        sampling = SamplingParams(
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            seed=settings.seed,
        )
        engine = engine_target(settings.hardware)
        plan = draft_plan(settings.drafter, policy=settings.policy, k=settings.k, hardware=engine)
        target = load_engine_target(settings.target, engine, settings.threads)
        result = run_collect(
            prompts,
            decoder=build_decoder(target, plan),
            tokenizer=target.tokenizer,
            store_root=store_root,
            run_id=run_id or _hourly_run_id(),
            hardware=engine,
            drafter_version=settings.drafter_version,
            sampling=sampling,
            max_new_tokens=settings.max_new_tokens,
            failure_threshold=settings.failure_threshold,
            chunk_size=settings.chunk_size,
        )
    except SpecOpsError as error:
        fail(str(error))
    if summary is not None:
        write_json_atomic(summary, result.model_dump(mode="json"))
    rate = result.acceptance_rate
    typer.echo(
        f"collected {result.written} records ({result.failures} failure cases, "
        f"{result.skipped_existing} already in the store) into {store_root}; acceptance "
        f"{'n/a' if rate is None else f'{rate:.3f}'}"
    )


@data_app.command()
def validate(
    params: ParamsOption = Path("params.yaml"),
    store_root: Annotated[Path, typer.Option("--store", help="The record store.")] = Path("data"),
    out: Annotated[Path, typer.Option(help="Folder for the dataset and quarantine.")] = Path(
        "data/dataset"
    ),
    summary: Annotated[Path | None, typer.Option(help="Write the summary JSON here.")] = None,
    plots: Annotated[Path | None, typer.Option(help="Folder for plot data (JSON).")] = None,
    full: Annotated[
        bool,
        typer.Option(help="Re-validate every part, not only those new since the last run."),
    ] = False,
) -> None:
    """Validate the store's new parts (Great Expectations), quarantine bad rows, build the
    dataset from every valid record (earlier runs' kept in <out>/validated/)."""
    from serving.atomic import write_json_atomic
    from serving.errors import SpecOpsError
    from tasks.data.curate import curate
    from tasks.data.params import load_params

    try:
        settings = load_params(params)
        result = curate(
            store_root,
            out,
            failure_share=settings.dataset.failure_share,
            seed=settings.dataset.seed,
            heldout_share=settings.dataset.heldout_share,
            window=settings.tracker.window,
            threshold=settings.tracker.threshold,
            plots_dir=plots,
            full=full,
        )
    except SpecOpsError as error:
        fail(str(error))
    write_json_atomic(summary or out / "summary.json", result.model_dump(mode="json"))
    checked = result.validation
    typer.echo(
        f"validated {checked.total} records: {checked.valid} valid, "
        f"{checked.quarantined} quarantined -> {out / 'quarantine.jsonl'}"
    )
    typer.echo("dataset: " + ", ".join(f"{k}={v}" for k, v in result.dataset.items()))
    if result.retrain_wanted:
        typer.echo("rolling acceptance is below the threshold: a retrain is wanted")


@data_app.command()
def acceptance(
    params: ParamsOption = Path("params.yaml"),
    store_root: Annotated[Path, typer.Option("--store", help="The record store.")] = Path("data"),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Rolling acceptance per workload and hardware target (params: tracker)."""
    from pydantic import ValidationError

    from serving.errors import SpecOpsError
    from serving.records.schema import UnknownSchemaVersionError, parse_record
    from serving.records.store import read_raw
    from tasks.data.acceptance import rolling_acceptance
    from tasks.data.params import load_params

    try:
        settings = load_params(params).tracker
        rows, malformed = [], 0
        for _, row in read_raw(store_root):
            try:
                rows.append(parse_record(row))
            except (ValidationError, UnknownSchemaVersionError):
                malformed += 1
        groups = rolling_acceptance(rows, window=settings.window, threshold=settings.threshold)
    except SpecOpsError as error:
        fail(str(error))
    if malformed:
        typer.echo(f"skipped {malformed} malformed records (see `specops data validate`)", err=True)
    if as_json:
        typer.echo(json.dumps([g.model_dump(mode="json") for g in groups]))
        return
    for g in groups:
        value = "n/a" if g.acceptance is None else f"{g.acceptance:.3f}"
        flag = "  <- retrain wanted" if g.retrain_wanted else ""
        typer.echo(f"{g.workload:<10} {g.hardware:<10} {value:>6} over {g.requests} requests{flag}")


@data_app.command()
def version(
    store_root: Annotated[Path, typer.Option("--store", help="The folder to version.")] = Path(
        "data"
    ),
    push: Annotated[bool, typer.Option("--push/--no-push", help="Push to the remote.")] = True,
) -> None:
    """Snapshot the store with DVC (`dvc add` + `dvc push`; a store outside the repository
    goes straight to the remote, its pointer is stores/NAME.dvc); commit the .dvc file."""
    from serving.errors import SpecOpsError
    from tasks.data.version import pointer, version_store

    try:
        digest = version_store(store_root, push=push)
    except SpecOpsError as error:
        fail(str(error))
    typer.echo(f"{store_root} versioned as {digest}; `git add {pointer(store_root)}` to record it")


# The dataset folders validated from the live store: the collect flow's, and `data validate`'s.
DEFAULT_DATASETS = (Path(".specops/work/dataset"), Path("data/dataset"))


@data_app.command()
def retention(
    store_root: Annotated[Path, typer.Option("--store", help="The live store.")] = Path("data"),
    datasets: Annotated[
        list[Path] | None,
        typer.Option(
            "--dataset",
            help="A dataset folder validated from the store, whose copies go too (repeat "
            "for each). Default: those of .specops/work/dataset (the collect flow's) and "
            "data/dataset (`data validate`'s) that exist.",
        ),
    ] = None,
    days: Annotated[
        float | None,
        typer.Option(
            help="Remove the parts whose newest row is older than this many days "
            "(default: retention.days of configs/store.yaml)."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be removed; change nothing.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Remove users' traffic older than the retention age from the store, and every copy
    validation kept of it (the collect flow does this before validating). DVC keeps what
    it versioned: see docs/data.md, "Retention"."""
    from serving.errors import SpecOpsError
    from tasks.data.retention import apply_retention, check_days, load_store_config

    try:
        days = load_store_config().retention.days if days is None else check_days(days)
        if not store_root.is_dir():
            fail(f"no store at {str(store_root)!r}: name the live store with --store")
        folders = datasets if datasets else [d for d in DEFAULT_DATASETS if d.is_dir()]
        report = apply_retention(store_root, folders, max_age_days=days, dry_run=dry_run)
    except SpecOpsError as error:
        fail(str(error))
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json")))
        return
    if report.max_age_days is None:
        typer.echo(
            "retention is off (retention.days is null in configs/store.yaml): nothing removed"
        )
        return
    verb = "would remove" if dry_run else "removed"
    age = f"older than {report.max_age_days:g} days (before {report.cutoff_utc})"
    if not report.removed:
        typer.echo(f"nothing in {store_root} is {age}")
    else:
        areas = ", ".join(
            f"{area} {count} ({report.rows[area]} rows)" for area, count in report.parts.items()
        )
        typer.echo(f"{verb} {len(report.removed)} parts {age} from {store_root}: {areas}")
    rewritten, dropped, removed = (
        ("to rewrite", "to drop", "to remove") if dry_run else ("rewritten", "dropped", "removed")
    )
    for folder in report.datasets:
        typer.echo(
            f"{folder.folder}: {folder.batches_rewritten} validated batches {rewritten}, "
            f"{folder.batches_dropped} {dropped}; {folder.copies} copied rows and "
            f"{folder.dataset_rows} dataset rows {removed}"
        )
    if dry_run:
        typer.echo("nothing changed (--dry-run)")
    elif report.folders or report.temporaries:
        typer.echo(
            f"also removed {report.folders} empty folders, {report.temporaries} stale temporaries"
        )
