"""``specops targets list|evaluate|bundle``: the table of hardware targets; evaluate's and
bundle's argument checks and refusals, each before any model work (vLLM is not installed
here: ``$SPECOPS_VLLM_PYTHON`` points at a missing interpreter); a bundle written for
another machine (the shipped model's tokenizer: ``real_model``)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from serving.backends import backend_info
from serving.engine.drafters.package import DraftManifest, write_package
from serving.hardware import load_hardware
from specops.cli import app

runner = CliRunner()


def _refused(result, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output


def test_list_names_every_target_its_backend_and_environment():
    result = runner.invoke(app, ["targets", "list"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines()}
    targets = load_hardware().targets
    assert set(rows) == set(targets)
    for name, target in targets.items():
        columns = rows[name].split()
        assert columns[1:3] == [target.backend, target.device]
        assert ("runs here" in rows[name]) == target.runs_here
        assert columns[-1] == (backend_info(target.backend).env_dir or ".venv")
    assert rows["cpu-vllm"].split()[-1] == ".venv-vllm"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--hardware", "tpu", "--drafter", "pld:3"], "unknown hardware target 'tpu'"),
        (["--hardware", "cuda-vllm", "--drafter", "pld:3"], "cannot run on this machine"),
        (["--hardware", "cpu", "--prompts", "0"], "Invalid value for '--prompts'"),
        (["--drafter", "pld:3"], "Missing option '--hardware'"),
    ],
    ids=["unknown-target", "not-runnable-here", "no-prompts", "no-target"],
)
def test_evaluate_checks_its_arguments(args, fragment, tmp_path):
    out = tmp_path / "targets.json"
    _refused(runner.invoke(app, ["targets", "evaluate", *args, "--out", str(out)]), fragment)
    assert not out.exists()


def test_evaluate_on_vllm_without_it_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_VLLM_PYTHON", str(tmp_path / "no-vllm" / "python"))
    out = tmp_path / "targets.json"
    args = ["targets", "evaluate", "--hardware", "cpu-vllm", "--drafter", "pld:3"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    _refused(result, "install it with: bash scripts/setup_backend.sh vllm")
    assert not out.exists()


def test_evaluate_the_champion_of_a_target_without_one_is_refused(registry_env, tmp_path):
    out = tmp_path / "targets.json"
    args = ["targets", "evaluate", "--hardware", "cpu", "--champion-of", "cpu"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    _refused(result, "hardware target 'cpu' has no champion to evaluate")
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--hardware", "cuda", "--challenger", "head/9"], "specops-draft-head has no version '9'"),
        (["--hardware", "cuda", "--challenger", "head"], "'head' does not name a draft version"),
        (["--hardware", "tpu", "--challenger", "head/1"], "unknown hardware target 'tpu'"),
    ],
    ids=["unknown-version", "not-a-version", "unknown-target"],
)
def test_bundle_refuses_before_loading_the_model(registry_env, tmp_path, args, fragment):
    out = tmp_path / "bundle"
    _refused(runner.invoke(app, ["targets", "bundle", *args, "--out", str(out)]), fragment)
    assert not out.exists()


@pytest.mark.real_model
def test_bundle_holds_the_challengers_and_the_encoded_prompts(registry_env, tmp_path):
    from registry.client import Registry

    registry = Registry()
    package = write_package(tmp_path / "pkg", DraftManifest(drafter="pld:3", k=4))
    draft = registry.log_draft(package, family="ngram")
    out = tmp_path / "bundle"
    args = ["--hardware", "cuda", "--challenger", f"ngram/{draft.version}", "--prompts", "2"]
    result = runner.invoke(app, ["targets", "bundle", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"bundle for cuda: 1 challenger(s), 2 prompts -> {out}" in result.output
    request = json.loads((out / "request.json").read_text())
    assert request["hardware"] == "cuda"
    assert request["contenders"] == {"challenger-0": f"ngram/{draft.version}"}
    prompts = json.loads((out / "prompts.json").read_text())
    assert len(prompts) == 2 and all(p["token_ids"] for p in prompts)
    copied = json.loads((out / "packages" / "challenger-0" / "draft.json").read_text())
    assert copied["drafter"] == "pld:3"
    model = registry.client.get_registered_model(draft.name)
    assert {k: str(v) for k, v in model.aliases.items()} == {"challenger-cuda": draft.version}
