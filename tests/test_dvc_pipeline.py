"""The DVC pipeline reproduces from a clean copy of this checkout, and runs an experiment.

The copy holds the files git tracks plus the untracked ones it does not ignore (so work not
yet committed is tested too), with a tiny params.yaml: two grounded prompts to train on
and one held out, 16 new tokens, a base-head corpus of three prompts; the experiment
changes the last stage's parameter, so only that stage runs again (each stage starts
Python; the model is cached).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.real_model


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (
        f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def _checkout_files() -> list[str]:
    names: list[str] = []
    for extra in ([], ["--others", "--exclude-standard"]):
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", *extra],
            capture_output=True,
            check=True,
        ).stdout.decode()
        names += [name for name in listed.split("\0") if name]
    return names


def _lock_params(repo: Path, stage: str) -> dict:
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return lock["stages"][stage]["params"]["params.yaml"]


def _records(repo: Path) -> list[dict]:
    from serving.records.store import read_raw

    return [row for _, row in read_raw(repo / "pipeline" / "store")]


@pytest.fixture
def clean_copy(tmp_path) -> tuple[Path, dict[str, str]]:
    """A git repository holding the checkout's files, and the environment to run DVC in."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of the project")
    copy = tmp_path / "repo"
    for name in _checkout_files():
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["traffic"].update(
        workloads=["grounded"], train_prompts_per_workload=2, heldout_prompts_per_workload=1
    )
    params["collect"]["max_new_tokens"] = 16  # enough drafts kept and rejected for a predictor
    params["predictor"].update(epochs=5, minutes=0.2)
    params["evaluate"].update(prompts=1, max_new_tokens=8)
    params["base"].update(
        prompts=3, max_prompt_tokens=128, max_new_tokens=6, reserve=4, heldout_prompts=2
    )
    params["base"]["head"].update(
        intermediate_size=64, draft_vocab=256, minutes=0.02, batch_size=2, max_seq_len=32,
        eval_every=5, checkpoint_every=5,
    )  # fmt: skip
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "DVC_NO_ANALYTICS": "1",
        "DVC_SITE_CACHE_DIR": str(tmp_path / "dvc-site-cache"),
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
    }
    for command in (
        ["git", "init", "-q"],
        ["git", "config", "user.name", "test"],
        ["git", "config", "user.email", "test@example.com"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "clean copy"],
    ):
        _run(command, copy, env)
    return copy, env


def test_dvc_repro_from_a_clean_copy_then_an_experiment(clean_copy):
    repo, env = clean_copy
    dvc = str(BIN / "dvc") if (BIN / "dvc").exists() else "dvc"

    _run([dvc, "repro"], repo, env)
    for name in (
        "dvc.lock",
        "metrics/collect.json",
        "metrics/validation.json",
        "plots/acceptance_by_position.json",
        "plots/acceptance_by_workload.json",
        "pipeline/traffic/train.jsonl",
        "pipeline/traffic/heldout.jsonl",
        *(f"pipeline/dataset/{split}.jsonl" for split in ("failures", "replay", "train_mix")),
        "pipeline/dataset/eval.jsonl",
        "pipeline/dataset/quarantine.jsonl",
        "pipeline/drafts/suffix/draft.json",
        "metrics/evaluate.json",
        "metrics/predictor.json",
        "pipeline/predictor/predictor.json",
        "pipeline/base/prompts.jsonl",
        "pipeline/base/answers.jsonl",
        "pipeline/base/teacher/manifest.json",
        "pipeline/base/heldout/manifest.json",
        "pipeline/base/head/head/head_config.json",
        "metrics/base_head.json",
        "heads/base-cpu-int4/manifest.json",
    ):
        assert (repo / name).is_file(), name
    evaluated = json.loads((repo / "metrics/evaluate.json").read_text())
    assert evaluated["results"]["draft"]["lossless"], evaluated["results"]
    collected = json.loads((repo / "metrics/collect.json").read_text())
    assert (collected["run_id"], collected["written"]) == ("pipeline", 3)
    validation = json.loads((repo / "metrics/validation.json").read_text())["validation"]
    assert (validation["total"], validation["valid"]) == (3, 3)
    assert _lock_params(repo, "collect")["collect"]["max_new_tokens"] == 16
    assert all(len(r["output_token_ids"]) <= 16 for r in _records(repo))
    answers = [json.loads(line) for line in (repo / "pipeline/base/answers.jsonl").open()]
    assert len(answers) == 3 and all(0 < len(a["answer_ids"]) <= 6 for a in answers)
    score = json.loads((repo / "metrics/base_head.json").read_text())
    assert score["sequences"] == 2 and score["drafted_by"] == "lean head step on cpu-int4"
    assert score["features_from"] == "cpu-int4" and score["k"] == 4
    from tasks.evaluate.ship_head import verify_shipped_head

    assert verify_shipped_head(repo / "heads/base-cpu-int4").heldout.sequences == 2

    status = _run([dvc, "status", "--json", "dvc.yaml"], repo, env)
    assert json.loads(status) == {}, status

    _run(["git", "add", "-A"], repo, env)
    _run(["git", "commit", "-q", "-m", "repro"], repo, env)
    # An experiment on the last stage's parameter: only that stage runs again.
    output = _run([dvc, "exp", "run", "-S", "evaluate.max_new_tokens=6"], repo, env)
    for upstream in ("build_traffic", "collect", "validate", "train_suffix", "train_predictor"):
        assert f"Stage '{upstream}' didn't change, skipping" in output, output
    assert yaml.safe_load((repo / "params.yaml").read_text())["evaluate"]["max_new_tokens"] == 6
    assert _lock_params(repo, "evaluate")["evaluate"]["max_new_tokens"] == 6
    assert json.loads((repo / "metrics/evaluate.json").read_text())["max_new_tokens"] == 6
    assert len(_records(repo)) == 3
    assert json.loads(_run([dvc, "status", "--json", "dvc.yaml"], repo, env)) == {}
