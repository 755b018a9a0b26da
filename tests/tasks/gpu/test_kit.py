"""The kit built here: its wheels, and ``specops gpu kit --dry-run`` on the shipped GGUF."""

import json
import re

from typer.testing import CliRunner

from serving.engine.drafters.package import DraftManifest, write_package
from specops.cli import app
from tasks.gpu.kit import wheel_pins


def test_the_wheels_are_the_small_packages_not_the_machines_own():
    names = {pin.split("==")[0] for pin in wheel_pins()}
    assert {"pydantic", "pydantic-settings", "typer", "gguf", "pyyaml", "pytest"} <= names
    assert "bitsandbytes" in names
    assert not names & {"torch", "transformers", "peft", "accelerate", "numpy", "sympy"}
    assert not any(name.startswith("nvidia-") for name in names)


def test_a_kit_that_does_not_train_leaves_bitsandbytes_behind():
    names = {pin.split("==")[0] for pin in wheel_pins(training=False)}
    assert {"pydantic", "typer", "gguf", "pyyaml", "pytest"} <= names
    assert "bitsandbytes" not in names


def _bundle(folder):
    folder.mkdir()
    (folder / "request.json").write_text(json.dumps({
        "format": 1, "hardware": "cuda", "max_new_tokens": 16,
        "contenders": {"challenger-0": "ngram/1"},
    }))  # fmt: skip
    (folder / "prompts.json").write_text(
        json.dumps([{"id": "p0", "workload": "grounded", "token_ids": [1, 2, 3]}])
    )
    write_package(folder / "packages" / "challenger-0", DraftManifest(drafter="pld:3"))
    return folder


def test_a_dry_run_checks_every_part_prints_the_plan_and_keeps_nothing(tmp_path):
    out = tmp_path / "kit"
    result = CliRunner().invoke(
        app,
        ["gpu", "kit", "--bundle", str(_bundle(tmp_path / "bundle")), "--out", str(out),
         "--no-wheels", "--dry-run"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # The 94 MiB GGUF in two parts of at most 60 MiB; the plan's steps and total.
    assert re.search(r"model\s+9\d\.\d MiB\s+2 part\(s\)", result.output), result.output
    assert "bash run.sh measure: ~" in result.output and "total: ~" in result.output
    assert re.search(r"draft package challenger-0 \(ngram/1: \d+ bytes\)", result.output)
    assert "dry run: every part fits; nothing kept" in result.output
    assert not out.exists()


def test_a_bundle_for_another_backend_or_a_tiny_part_size_is_refused(tmp_path):
    bundle = _bundle(tmp_path / "bundle")
    result = CliRunner().invoke(
        app, ["gpu", "kit", "--bundle", str(bundle), "--part-size", "0.5", "--dry-run"]
    )
    assert result.exit_code == 2 and "greater than or equal to 1" in result.output
    request = json.loads((bundle / "request.json").read_text())
    (bundle / "request.json").write_text(json.dumps({**request, "hardware": "cuda-vllm"}))
    result = CliRunner().invoke(app, ["gpu", "kit", "--bundle", str(bundle), "--dry-run"])
    assert result.exit_code != 0 and "cuda-vllm" in result.output
    assert "Traceback" not in result.output
