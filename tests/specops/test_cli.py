from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specops.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["   "], "the prompt is empty"),
        (["hi", "--drafter", "foo"], "unknown drafter 'foo'"),
        (["hi", "--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (["hi", "--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["hi", "--k", "0"], "k must be between 1 and 64, got 0"),
        (["hi", "--k", "100000"], "k must be between 1 and 64, got 100000"),
        (["hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["hi", "--mode", "verbose"], "unknown mode 'verbose'"),
        (["hi", "--policy", "magic"], "unknown policy 'magic'"),
        (["hi", "--hardware", "tpu"], "unknown hardware target 'tpu'"),
        (["hi", "--max-new-tokens", "0"], "max_new_tokens must be >= 1, got 0"),
        (["hi", "--top-k", "-3"], "top_k must be an integer >= 0"),
        (["hi", "--threads", "0"], "threads must be an integer >= 1"),
    ],
)
def test_bad_generate_options_fail_with_the_value_named(args, fragment):
    result = runner.invoke(app, ["generate", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--drafter", "suffix"], "--drafter 'suffix' needs files"),
        (["--drafter", "magic"], "unknown drafter 'magic'"),
        (["--hardware", "tpu"], "unknown hardware target 'tpu'"),
        (["--hardware", "cpu-vllm"], "runs on the 'vllm' backend"),
    ],
)
def test_bad_bootstrap_options_fail_before_any_flow_runs(args, fragment):
    result = runner.invoke(app, ["loop", "bootstrap", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output


def test_the_command_line_loads_without_torch():
    """`specops --help` does not pay for torch or transformers (docs/architecture.md)."""
    import subprocess
    import sys

    probe = "import sys, specops.cli; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.real_model
def test_generate_json_on_the_real_model(real_packed):
    result = runner.invoke(
        app,
        ["generate", "Say hello.", "--max-new-tokens", "12", "--json", "--mode", "detailed"],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(payload) >= {"text", "token_ids", "from_draft", "stats", "record", "threads"}
    assert 1 <= len(payload["token_ids"]) <= 12
    assert payload["stats"]["generated_tokens"] == len(payload["token_ids"])
    assert payload["record"]["schema_version"] == 2
    assert payload["unverified"] == []  # lossless by default


@pytest.mark.real_model
def test_prompt_longer_than_the_context_is_refused(real_packed):
    result = runner.invoke(app, ["generate", "word " * 9000, "--no-chat"])
    assert result.exit_code == 2
    assert "exceeds the model's context of 8192 tokens" in result.output
