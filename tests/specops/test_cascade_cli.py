"""``specops cascade``: ``collect`` checks its options before any model loads; the λ sweep is
a study now (``python -m benchmarks.cascade_sweep``), not a command."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from specops.cascade_cli import cascade_app

app = typer.Typer()
app.add_typer(cascade_app, name="cascade")


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--stages", "pld:3,medusa", "medusa"),
        ("--workloads", "sharegpt,poetry", "poetry"),
        ("--hardware", "tpu-v9", "tpu-v9"),
    ],
)
def test_collect_refuses_bad_options_before_a_model_loads(tmp_path, option, value, message):
    result = invoke(
        "cascade", "collect", option, value, "--target", tmp_path / "no-model",
        "--store", tmp_path / "store", "--prompts", 1, "--heldout-prompts", 0,
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "store").exists()


def test_the_sweep_is_no_longer_a_command():
    result = invoke("cascade", "sweep")
    assert result.exit_code == 2 and "No such command 'sweep'" in result.output
