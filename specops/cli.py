"""The ``specops`` command line: the app, its global options, and where each command lives
(the ``specops/*_cli.py`` modules parse options, call serving/ and tasks/, and print)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from specops.bench_cli import bench, bench_skeleton, profile
from specops.cascade_cli import cascade_app
from specops.chat_cli import chat
from specops.data_cli import data_app
from specops.deploy_cli import deploy_app
from specops.distributed_cli import distributed_app
from specops.draft_cli import register_draft_commands
from specops.exit import failing
from specops.generate_cli import generate
from specops.gpu_cli import gpu_app
from specops.loop_cli import loop_app
from specops.predictor_cli import predictor_app
from specops.quality_cli import quality
from specops.registry_cli import registry_app
from specops.serve_cli import loadtest, model_path, serve
from specops.simulate_cli import simulate_app
from specops.stack_cli import stack_app
from specops.targets_cli import targets_app
from specops.teacher_cli import teacher_app

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

app = typer.Typer(
    help="specops: speculative decoding that keeps itself fast.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main(
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri",
            help="The MLflow tracking store for this command (over MLFLOW_TRACKING_URI, "
            "SPECOPS_MLFLOW_URI and configs/registry.yaml): http://host:5000, "
            "postgresql://user@host/db, sqlite:///path. docs/configuration.md.",
        ),
    ] = None,
    registry_uri: Annotated[
        str | None,
        typer.Option(
            "--registry-uri",
            help="The MLflow model registry, if not the tracking store (over MLFLOW_REGISTRY_URI).",
        ),
    ] = None,
    registry_config: Annotated[
        Path | None,
        typer.Option(
            "--registry-config",
            help="The registry's YAML file instead of configs/registry.yaml (over "
            "SPECOPS_REGISTRY_CONFIG).",
        ),
    ] = None,
) -> None:
    """specops: speculative decoding that keeps itself fast."""
    # The top layer of the registry's settings, for this process and those it starts;
    # checked here when given, so that a bad one fails before any command runs. Without
    # them a command that never reaches the registry (`specops profile` on a GPU machine
    # holding only torch and transformers) does not import its settings (pydantic-settings);
    # once imported, they are reset, so an earlier call's overrides do not leak.
    given = tracking_uri or registry_uri or registry_config
    if not given and "registry.config" not in sys.modules:
        return
    from registry.config import load_registry_config, set_overrides

    set_overrides(tracking_uri=tracking_uri, registry_uri=registry_uri, config_file=registry_config)
    if given:
        with failing():
            load_registry_config()


app.add_typer(data_app, name="data")
app.add_typer(distributed_app, name="distributed")
app.add_typer(cascade_app, name="cascade")
app.add_typer(registry_app, name="registry")
app.add_typer(stack_app, name="stack")
app.add_typer(deploy_app, name="deploy")
register_draft_commands(app)
app.add_typer(loop_app, name="loop")
app.add_typer(predictor_app, name="predictor")
app.add_typer(targets_app, name="targets")
app.add_typer(gpu_app, name="gpu")
app.add_typer(teacher_app, name="teacher")
app.command("quality")(quality)
app.command("chat")(chat)
app.command()(generate)
app.command("bench-skeleton")(bench_skeleton)
app.add_typer(simulate_app, name="simulate")
app.command()(bench)
app.command()(profile)
app.command()(serve)
app.command()(loadtest)
app.command("model-path")(model_path)


if __name__ == "__main__":
    app()
