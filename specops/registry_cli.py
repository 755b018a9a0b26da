"""``specops registry ...``: look at and act on the MLflow draft registry.

Bad input (a malformed version, an unknown hardware target, an unreadable or inconsistent
evaluation file) exits 2 via :func:`specops.exit.fail`; a refusal by the registry (no
such version, not evaluated on that target, the champion moved) exits 1. Either way one
line says why, and nothing was changed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from specops.exit import fail, failing

registry_app = typer.Typer(help="The MLflow draft registry: drafts, champions, rollback.")


def _registry():
    from registry.client import Registry

    return Registry()


@contextmanager
def _refusing() -> Iterator[None]:
    """Inside, a SpecOpsError ends the command: 1 for a registry refusal, 2 for bad input."""
    from registry.client import RegistryError

    with failing(refusals=(RegistryError,)):
        yield


@registry_app.command("show")
def show(
    version: Annotated[
        str | None,
        typer.Argument(
            help="FAMILY/VERSION (head/3) or the full label: print that version's lineage."
        ),
    ] = None,
    hardware: Annotated[
        str | None, typer.Option(help="Only this hardware target's champion.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="With VERSION: print one JSON object.")
    ] = False,
) -> None:
    """Print every draft family, its versions and aliases, and each target's champion.

    With VERSION, that version's lineage instead: the data version and git commit it was
    made from, the run that produced it, its evaluation runs per hardware target (with
    theirs), the aliases it holds and its promotions."""
    from serving.hardware import load_hardware

    if version is not None:
        _show_version(version, as_json=as_json)
        return
    with failing():
        registry = _registry()
        targets = [hardware] if hardware else sorted(load_hardware().targets)
        champions = {hw: registry.champion(hw) for hw in targets}
        families = {}
        for family in registry.families():
            name = registry.model_name(family)
            versions = registry.client.search_model_versions(f"name = '{name}'")
            model = registry.client.get_registered_model(name)
            families[family] = {
                "registered_model": name,
                "versions": sorted(int(v.version) for v in versions),
                "aliases": dict(model.aliases or {}),
            }
    payload = {
        **_stores(registry),
        "champions": {hw: d.label if d else None for hw, d in champions.items()},
        "families": families,
    }
    typer.echo(json.dumps(payload, indent=2))


def _stores(registry) -> dict[str, str]:
    """The tracking store's URI (and the registry's, when it is another), passwords masked."""
    from registry.config import mask_uri

    shown = {"tracking_uri": mask_uri(registry.tracking_uri)}
    if registry.registry_uri != registry.tracking_uri:
        shown["registry_uri"] = mask_uri(registry.registry_uri)
    return shown


NO_LINEAGE = "no lineage recorded"


def _lineage_line(lineage: dict[str, str]) -> str:
    """``data_version X, git_commit Y``; a missing one is named; none: NO_LINEAGE."""
    if not lineage:
        return NO_LINEAGE
    return ", ".join(
        f"{key} {lineage[key]}" if key in lineage else f"{key} not recorded"
        for key in ("data_version", "git_commit")
    )


def _run_line(run: dict[str, Any] | None) -> str:
    if run is None:
        return "no run recorded"
    if not run["found"]:
        return f"run {run['run_id']} (not found in the tracking store)"
    state = ", deleted" if run["deleted"] else ""
    return f"run {run['run_id']} {run['name']!r} ({run['status']}{state}, {run['started']})"


def _show_version(label: str, *, as_json: bool) -> None:
    with _refusing():
        registry = _registry()
        lineage = registry.lineage(registry.resolve(label))
    if as_json:
        typer.echo(json.dumps({**_stores(registry), **lineage}, indent=2))
        return
    lines = [
        f"{lineage['label']} (family {lineage['family']}) in {registry.shown_uri}",
        f"lineage: {_lineage_line(lineage['lineage'])}",
        f"produced by: {_run_line(lineage['run'])}",
    ]
    evaluations = lineage["evaluations"]
    lines.append("evaluations:" + ("" if evaluations else " none"))
    for hw, run in evaluations.items():
        lines.append(f"  {hw}: {_run_line(run)}; {_lineage_line(run['lineage'])}")
    lines.append("aliases: " + (", ".join(lineage["aliases"]) or "none"))
    promotions = lineage["promotions"]
    lines.append("promotions:" + ("" if promotions else " none"))
    for record in promotions:
        was = f" (was {record['previous']})" if record["previous"] else ""
        undone = ", rolled back" if record["rolled_back"] else ""
        lines.append(
            f"  {record['at']} {record['action']} on {record['hardware']}{was}: "
            f"{record['reason']} [run {record['run_id']}{undone}]"
        )
    typer.echo("\n".join(lines))


@registry_app.command("register")
def register(
    package: Annotated[Path, typer.Argument(help="A draft package folder (draft.json).")],
    family: Annotated[str, typer.Option(help="Draft family (ngram, suffix, head, lora...).")],
) -> None:
    """Register a draft package as a new version of its family (not promoted)."""
    with failing():
        draft = _registry().log_draft(package, family=family)
    typer.echo(f"registered {draft.label} (run {draft.run_id})")


@registry_app.command("rollback")
def rollback(
    hardware: Annotated[str, typer.Option(help="The hardware target to roll back.")],
    reason: Annotated[str, typer.Option(help="Why (kept in the audit run).")] = "manual rollback",
) -> None:
    """Give the champion alias back to the version the last promotion displaced."""
    with failing():
        draft = _registry().rollback(hardware, reason=reason)
    typer.echo(f"champion-{hardware} -> {draft.label}")


@registry_app.command("clear-rollback")
def clear_rollback(
    version: Annotated[str, typer.Argument(help="FAMILY/VERSION (head/3) or the full label.")],
    hardware: Annotated[str, typer.Option(help="The hardware target it was rolled back on.")],
) -> None:
    """Let a version the watched champion rolled back (tasks/loop/watch.py) be promoted on
    that target again, once someone has examined it."""
    from serving.hardware import hardware_target

    with _refusing():
        hardware_target(hardware)
        registry = _registry()
        draft = registry.resolve(version)
        cleared = registry.clear_rollback(draft, hardware)
    typer.echo(
        f"{draft.label} may be promoted on {hardware} again"
        if cleared
        else f"{draft.label} was not held on {hardware}: nothing to clear"
    )


@registry_app.command("describe")
def describe(
    version: Annotated[str, typer.Argument(help="FAMILY/VERSION (head/3) or the full label.")],
) -> None:
    """Print one version: its tags (lineage, evaluations, exports), its run's parameters
    and final metrics, and the aliases it holds."""
    with _refusing():
        registry = _registry()
        draft = registry.resolve(version)
        run = registry.client.get_run(draft.run_id)
        model = registry.client.get_registered_model(draft.name)
    payload = {
        "label": draft.label,
        "family": draft.family,
        "run_id": draft.run_id,
        "source": draft.source,
        "aliases": sorted(a for a, v in (model.aliases or {}).items() if str(v) == draft.version),
        "tags": dict(sorted(draft.tags.items())),
        "params": dict(sorted(run.data.params.items())),
        "metrics": dict(sorted(run.data.metrics.items())),
    }
    typer.echo(json.dumps(payload, indent=2))


@registry_app.command("promote")
def promote(
    version: Annotated[str, typer.Argument(help="FAMILY/VERSION (head/3) or the full label.")],
    hardware: Annotated[str, typer.Option(help="The hardware target it will serve on.")],
    reason: Annotated[str, typer.Option(help="Why (kept in the audit run).")] = (
        "manual promotion"
    ),
) -> None:
    """Make a version the champion of a hardware target. Refused unless it was evaluated
    there (and, off the specops engine, exported for that target's backend)."""
    from serving.hardware import hardware_target

    with _refusing():
        hardware_target(hardware)
        registry = _registry()
        draft = registry.resolve(version)
        run_id = registry.promote(draft, hardware, reason=reason)
        record = registry.client.get_run(run_id).data.tags  # the champion it displaced
        was = (
            f"{registry.model_name(record['previous_family'])}/{record['previous_version']}"
            if record.get("previous_family")
            else "none (plain decoding)"
        )
    typer.echo(f"champion-{hardware} -> {draft.label} (was {was}; audit run {run_id})")


@registry_app.command("log-evaluation")
def log_evaluation(
    file: Annotated[
        Path, typer.Argument(help="An evaluation file (tasks/evaluate/evaluation_file.py).")
    ],
    promote: Annotated[
        bool,
        typer.Option(
            "--promote/--no-promote",
            help="Gate each challenger against the file's champion and promote the fastest "
            "that passes (refused if the champion moved since the evaluation).",
        ),
    ] = False,
) -> None:
    """Record an evaluation that ran on another machine (``python -m tasks.evaluate.remote``):
    each contender's numbers go to its version, which is then marked evaluated on that
    hardware target, and the gates judge each challenger. The file is checked first, and
    every version it names must exist; otherwise nothing is logged."""
    from serving.hardware import hardware_target
    from serving.models.real import cache_root
    from tasks.evaluate.evaluation_file import read_evaluation_file
    from tasks.loop.evaluation_steps import decide

    with _refusing():
        evaluation = read_evaluation_file(file)
        registry = _registry()
        drafts = {name: registry.resolve(label) for name, label in evaluation.contenders.items()}
    hardware = evaluation.hardware
    params = {
        "prompts": evaluation.prompts,
        "max_new_tokens": evaluation.max_new_tokens,
        "source": "evaluation-file",
        **{f"produced_by.{k}": v for k, v in evaluation.produced_by.items()},
    }
    with _refusing():
        decision = decide(
            registry,
            evaluation.report,
            drafts,
            hardware=hardware_target(hardware),  # the file names a known target
            cache=cache_root() / "registry",
            promote=promote,
            params=params,
            artifacts=[file],
        )
    for name, draft in drafts.items():
        shown = ", ".join(f"{k} {v:.3f}" for k, v in evaluation.metrics_of(name).items())
        typer.echo(f"{name}: {draft.label} evaluated on {hardware}: {shown}")
    for label, result in decision.gates.items():
        typer.echo(f"gate {label}: {result.reason}")
    if decision.promoted:
        typer.echo(f"champion-{hardware} -> {decision.promoted}")
    elif promote:
        typer.echo(f"champion-{hardware} kept: {decision.champion}")


@registry_app.command("export")
def export(
    version: Annotated[str, typer.Argument(help="FAMILY/VERSION (suffix/2) or the full label.")],
    hardware: Annotated[str, typer.Option(help="The hardware target to deploy it on.")],
    out: Annotated[
        Path | None,
        typer.Option(help="Folder to write (default: exports/<family>-<version>-<target>)."),
    ] = None,
    cache: Annotated[Path, typer.Option(help="Download cache.")] = Path(".specops/cache"),
) -> None:
    """Write VERSION's export for HARDWARE's backend into OUT and print the configuration
    the backend takes: for vLLM, the ``--speculative-config`` JSON in vLLM's own keys
    (also written as OUT/speculative_config.json, its draft path pointing into OUT)."""
    import shutil

    from serving.atomic import atomic_dir, write_json_atomic
    from serving.backends.exports import load_export
    from serving.backends.vllm_config import speculative_config
    from serving.hardware import hardware_target
    from tasks.loop.target_promotion import ensure_export

    with _refusing():
        spec = hardware_target(hardware)
        if spec.backend == "transformers":
            fail(
                f"hardware target {hardware!r} runs on the specops engine, which loads the "
                "draft package itself (`specops serve --drafter`); export is for other backends"
            )
        registry = _registry()
        draft = registry.resolve(version)
        folder = ensure_export(registry, draft, spec.backend, cache, k=spec.num_speculative_tokens)
        out = out or Path("exports") / f"{draft.family}-{draft.version}-{hardware}"
        with atomic_dir(out) as scratch:
            shutil.copytree(folder, scratch, dirs_exist_ok=True)
        speculation = load_export(out, spec.backend)
        config = (
            speculative_config(speculation) if spec.backend == "vllm" else speculation.to_dict()
        )
        if spec.backend == "vllm":
            write_json_atomic(out / "speculative_config.json", config)
    typer.echo(json.dumps(config))
    typer.echo(f"# {draft.label} for {hardware} ({spec.backend}) in {out}", err=True)
    if spec.backend == "vllm" and config is not None:
        typer.echo(
            f'# vllm serve MODEL --speculative-config "$(cat {out}/speculative_config.json)"',
            err=True,
        )
