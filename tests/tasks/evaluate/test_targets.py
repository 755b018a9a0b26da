"""Per-target evaluation: checks before model work, and the whole pipe (export, a backend
process, its report) on the specops engine's own target."""

from __future__ import annotations

import pytest

from serving.backends import BackendUnavailableError
from serving.engine.drafters.package import DraftManifest, write_package
from serving.errors import BadInputError
from serving.hardware import hardware_target
from tasks.data.prompts import Prompt
from tasks.evaluate.targets import backend_python, evaluate_target, metrics_of, table

PROMPTS = [
    Prompt(
        id="p1",
        workload="humaneval",
        split="heldout",
        reference="",
        messages=[
            {
                "role": "user",
                "content": "def add(a, b):\n    return a + b\nRepeat the function above exactly.",
            }
        ],
    ),
    Prompt(
        id="p2",
        workload="sharegpt",
        split="heldout",
        reference="",
        messages=[{"role": "user", "content": "Name three colours."}],
    ),
]


def test_an_uninstalled_backend_environment_names_its_setup(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECOPS_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(BackendUnavailableError, match=r"scripts/setup_backend.sh vllm"):
        backend_python("vllm")
    pkg = write_package(tmp_path / "pkg", DraftManifest(drafter="pld:3"))
    with pytest.raises(BackendUnavailableError):
        evaluate_target(hardware_target("cpu-vllm"), {"pld": pkg}, PROMPTS, workdir=tmp_path / "w")


def test_targets_this_machine_cannot_run_say_so(tmp_path):
    pkg = write_package(tmp_path / "pkg", DraftManifest(drafter="pld:3"))
    for hardware in ("cuda-vllm", "trn1-neuron"):
        with pytest.raises(BadInputError, match="cannot run on this machine"):
            evaluate_target(
                hardware_target(hardware), {"pld": pkg}, PROMPTS, workdir=tmp_path / "w"
            )
    with pytest.raises(BadInputError, match="unknown hardware target 'tpu'"):
        evaluate_target(hardware_target("tpu"), {"pld": pkg}, PROMPTS, workdir=tmp_path / "w")


@pytest.mark.real_model
def test_the_engine_target_through_the_backend_process(tmp_path, model_folder):
    packages = {
        "pld": write_package(tmp_path / "pld", DraftManifest(drafter="pld:3")),
        "layers1": write_package(tmp_path / "l1", DraftManifest(drafter="layers:1")),
    }
    report = evaluate_target(
        hardware_target("cpu"),
        packages,
        PROMPTS,
        workdir=tmp_path / "w",
        target=str(model_folder),
        max_new_tokens=12,
        k=2,
    )
    assert report["hardware"] == "cpu" and report["backend"] == "transformers"
    for name in packages:
        result = report["results"][name]
        assert result["exact"], name
        assert result["generated_tokens"] > 0 and result["checks"] > 0
        metrics = metrics_of(result, report["results"]["plain"])
        assert metrics["exact"] == 1.0 and metrics["speedup"] > 0
    assert report["results"]["layers1"]["draft_tokens"] > 0
    text = table([report])
    assert "cpu" in text and "layers1" in text and "yes" in text


def test_drafts_a_backend_cannot_load_are_reported_not_run(monkeypatch, tmp_path):
    import sys

    from serving.backends import UnsupportedDraftError

    monkeypatch.setenv("SPECOPS_MLX_PYTHON", sys.executable)  # "installed"
    pkg = write_package(tmp_path / "pkg", DraftManifest(drafter="pld:3"))
    with pytest.raises(UnsupportedDraftError, match="no draft given can run on 'cpu-mlx'"):
        evaluate_target(hardware_target("cpu-mlx"), {"pld": pkg}, PROMPTS, workdir=tmp_path / "w")
    report = {
        "hardware": "cpu-mlx",
        "backend": "mlx",
        "results": {"plain": {}},
        "unsupported": {"pld": "no"},
    }
    assert "cannot load this draft" in table([report])
