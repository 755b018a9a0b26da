"""A bad draft plan is refused at parse time, naming the bad value, before any weights load,
on every front: the command line, the serving config (and ``specops serve``), a draft
package, an HTTP request (tests/serving/server/test_app.py,
``test_bad_requests_get_openai_errors``, runs against a loaded server, where a plan's
drafter is refused before it is built)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from serving.engine.drafters.package import read_manifest
from serving.errors import BadInputError, ModelSourceError
from serving.server.config import load_server_config
from specops.cli import app

runner = CliRunner()

BAD_PLANS = [  # (what is bad, its options, the message's fragment)
    ("kind", {"drafter": "warp:9"}, "unknown drafter 'warp:9'"),
    ("k", {"k": 0}, "k must be between 1 and 64, got 0"),
    ("policy", {"policy": "magic"}, "unknown policy 'magic'"),
]


@pytest.fixture
def no_weights(monkeypatch):
    """Any attempt to read a model's weights fails the test."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError(f"weights were loaded: {args} {kwargs}")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr("serving.loader.load_target", refuse)


def _options(fields: dict[str, object]) -> list[str]:
    return [part for name, value in fields.items() for part in (f"--{name}", str(value))]


@pytest.mark.parametrize(("bad", "fields", "fragment"), BAD_PLANS, ids=[p[0] for p in BAD_PLANS])
def test_the_command_line_refuses_a_bad_plan_before_any_weights(no_weights, bad, fields, fragment):
    result = runner.invoke(app, ["generate", "hi", *_options(fields)])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"champion.drafter": "warp:9"}, "champion.drafter 'warp:9': unknown drafter 'warp:9'"),
        ({"champion.k": 0}, "champion.k: Input should be greater than or equal to 1"),
        ({"champion.policy": "magic"}, "champion.policy: Input should be"),
        ({"cascade.stages": "suffix,warp"}, "cascade.stages 'suffix,warp': unknown drafter 'warp'"),
    ],
)
def test_the_serving_config_refuses_a_bad_plan_naming_its_key(overrides, fragment):
    with pytest.raises(BadInputError) as error:
        load_server_config(**overrides)
    assert fragment in str(error.value)


def test_serve_refuses_a_bad_drafter_before_any_weights(no_weights):
    result = runner.invoke(app, ["serve", "--drafter", "warp:9"])
    assert result.exit_code == 2, result.output
    assert "unknown drafter 'warp:9'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("manifest", "fragment"),
    [
        ({"drafter": "warp:9"}, "unknown drafter 'warp:9'"),
        ({"drafter": "pld", "k": 0}, "bad draft.json"),
        ({"drafter": "pld", "policy": "magic"}, "unknown policy 'magic'"),
    ],
)
def test_a_draft_package_with_a_bad_plan_is_refused_before_its_weights(
    tmp_path, no_weights, manifest, fragment
):
    (tmp_path / "draft.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelSourceError) as error:
        read_manifest(tmp_path)
    assert fragment in str(error.value)
    assert str(tmp_path) in str(error.value)
