"""``specops registry ...``: look at and act on the MLflow draft registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specops.exit import fail

registry_app = typer.Typer(help="The MLflow draft registry: drafts, champions, rollback.")


def _registry():
    from registry.client import Registry

    return Registry()


@registry_app.command("show")
def show(
    hardware: Annotated[
        str | None, typer.Option(help="Only this hardware target's champion.")
    ] = None,
) -> None:
    """Print every draft family, its versions and aliases, and each target's champion."""
    from serving.errors import SpecOpsError
    from serving.hardware import load_hardware

    try:
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
    except SpecOpsError as error:
        fail(str(error))
    payload = {
        "tracking_uri": registry.tracking_uri,
        "champions": {hw: d.label if d else None for hw, d in champions.items()},
        "families": families,
    }
    typer.echo(json.dumps(payload, indent=2))


@registry_app.command("register")
def register(
    package: Annotated[Path, typer.Argument(help="A draft package folder (draft.json).")],
    family: Annotated[str, typer.Option(help="Draft family (ngram, suffix, head, lora...).")],
) -> None:
    """Register a draft package as a new version of its family (not promoted)."""
    from serving.errors import SpecOpsError

    try:
        draft = _registry().log_draft(package, family=family)
    except SpecOpsError as error:
        fail(str(error))
    typer.echo(f"registered {draft.label} (run {draft.run_id})")


@registry_app.command("rollback")
def rollback(
    hardware: Annotated[str, typer.Option(help="The hardware target to roll back.")],
    reason: Annotated[str, typer.Option(help="Why (kept in the audit run).")] = "manual rollback",
) -> None:
    """Give the champion alias back to the version the last promotion displaced."""
    from serving.errors import SpecOpsError

    try:
        draft = _registry().rollback(hardware, reason=reason)
    except SpecOpsError as error:
        fail(str(error))
    typer.echo(f"champion-{hardware} -> {draft.label}")
