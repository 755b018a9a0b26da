"""``specops loop ...`` through the Typer app: the main job end to end on a tiny target
(its report, registry and records), then the commands that work on its workspace
(``head-curve``, ``run``), and ``serve`` registering its scheduled deployments.

The target is a tiny random Llama with a character tokenizer, saved as a model folder and
named by ``SPECOPS_TARGET`` as a user names theirs: every step loads it as it would load the
real model, on the real workloads. Four things are configured for the test, so that the
main job is the same run on every try, whatever the machine's load: the retrain's families
train a fixed number of optimiser steps (``max_steps`` in ``TINY_RETRAIN``, under a time
budget they never reach); the gates price speed by a fixed profile under which prompt
lookup must pass, with the wall clock's interval check off; the cost-aware draft-length
policy prices drafting by that profile instead of the seconds it measures
(``tests/tasks/loop/priced_gates.py``); and MLflow's run ids and the download cache's
folder, which name the packages that served each request, are the same on every run
(``_same_names_on_every_run``). What the run did (tokens, steps, acceptance, gate
decisions) is compared with the baseline recorded before the refactor
(``tests/fixtures/behaviour/tiny-main-job.json``, ``tests/specops/loop_digest.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

import tasks.loop.retrain_config as retrain_config
from serving.models.tiny import tiny_llama
from serving.paths import PROJECT_ROOT
from serving.records.store import read_raw
from specops.cli import app
from tests.fixtures.cpu_kind import require_recorded_cpu_kind
from tests.specops.conftest import make_char_tokenizer
from tests.specops.loop_digest import differences, dumps, loop_digest, outline
from tests.tasks.loop.priced_gates import use_priced_gates, use_priced_policy

runner = CliRunner()
DVC = str(Path(sys.executable).with_name("dvc"))

LOAD_RETRAIN = retrain_config.load_retrain_config  # the real loader, before any patch

TINY_RETRAIN = """
relative_threshold: 0.8
cooldown_minutes: 360
targets:
  cpu:
    families: [head, lora]
    threads: 1
    min_sequences: 2
    min_answer_tokens: 8
    head:
      budget_seconds: 600
      max_steps: 20
      settings: {batch_size: 2, max_seq_len: 64, eval_every: 5, checkpoint_every: 5,
                 eval_fraction: 0.0}
    lora:
      budget_seconds: 600
      max_steps: 20
      settings: {layers: 1, loss: ce, lora_r: 2, lora_alpha: 4, batch_size: 2, max_seq_len: 64,
                 eval_every: 5, checkpoint_every: 5, eval_fraction: 0.0}
"""

DEMO = dict(before_prompts=3, after_prompts=4, max_new_tokens=8)
TRAIN_SECONDS = 600  # a budget the step bounds (max_steps) always reach first
# What the main job did on today's code (before the refactor of issue 50), as
# tests/specops/loop_digest.py digests it.
BEHAVIOUR = Path(__file__).parents[1] / "fixtures" / "behaviour" / "tiny-main-job.json"


def _invoke(*args: object, env: dict[str, str] | None = None):
    return runner.invoke(app, ["loop", *map(str, args)], env=env)


@pytest.fixture(scope="module")
def harness(prefect_harness):
    """The session's Prefect test server (tests/conftest.py)."""


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    """The tiny target as a model folder; long enough context for the real workloads'
    prompts (up to ~1,500 characters, one token each)."""
    folder = tmp_path_factory.mktemp("tiny-target")
    tiny_llama(max_positions=4096).save_pretrained(folder)
    make_char_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def loop_world(harness, tiny_target, tmp_path_factory):
    """Where the loop's commands run in this module: the tiny target, its retrain config,
    priced gates, a temporary working directory (``results/`` goes there)."""
    root = tmp_path_factory.mktemp("loop-cli")
    # A project of its own: `loop run collect` versions the store with DVC.
    remote = tmp_path_factory.mktemp("dvc-remote")
    for command in (["git", "init", "-q"], [DVC, "init", "-q"],
                    [DVC, "remote", "add", "-d", "local", str(remote)]):  # fmt: skip
        subprocess.run(command, cwd=root, check=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    config = root / "retrain.yaml"
    config.write_text(TINY_RETRAIN)
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("SPECOPS_TARGET", str(tiny_target))
        # What the commands set with setdefault, set here so that it ends with the module.
        patch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
        patch.setenv("PREFECT_LOGGING_LEVEL", "WARNING")
        patch.setattr(retrain_config, "load_retrain_config", lambda path=config: LOAD_RETRAIN(path))
        use_priced_gates(patch, root)
        use_priced_policy(patch)  # drafting priced by the profile, not by the clock
        yield root
    torch.set_num_threads(threads)  # `--threads` sets it for the process


class _CountingUuid:
    """``uuid.uuid4`` for MLflow's tracking store: run ids 1, 2, ... in creation order."""

    def __init__(self) -> None:
        self.created = 0

    def uuid4(self) -> uuid.UUID:
        self.created += 1
        return uuid.UUID(int=self.created, version=4)


def _same_names_on_every_run(patch: pytest.MonkeyPatch, root: Path) -> str:
    """What the demo names the same way on every run, returned as its ``SPECOPS_CACHE``.

    A served request's id hashes its drafter's description, and a head or LoRA drafter is
    described by its package's folder: the download cache's ``<family>/<version>-<MLflow
    run id>``. The retrain orders its training mix by those ids, so a random run id or
    another cache folder trains another head. Here MLflow's run ids count up, and the
    cache is ``cache`` in the working directory (the machine's data, model and kernel
    caches linked in, so nothing is built again)."""
    from mlflow.store.tracking import sqlalchemy_store

    from serving.models.real import cache_root

    patch.setattr(sqlalchemy_store, "uuid", _CountingUuid())
    shared, own = cache_root(), root / "cache"
    own.mkdir()
    for entry in sorted(shared.iterdir()) if shared.is_dir() else []:
        if entry.is_dir() and entry.name not in ("registry", "locks"):
            (own / entry.name).symlink_to(entry, target_is_directory=True)
    return own.name


@pytest.fixture(scope="module")
def demo(loop_world):
    """``specops loop demo`` once, with the smallest sizes; its output and workspace."""
    work = loop_world / "demo"
    started = time.perf_counter()
    with pytest.MonkeyPatch.context() as patch:
        cache = _same_names_on_every_run(patch, loop_world)
        result = _invoke(
            "demo", "--work", work, "--before-prompts", DEMO["before_prompts"],
            "--after-prompts", DEMO["after_prompts"], "--max-new-tokens", DEMO["max_new_tokens"],
            "--head-seconds", TRAIN_SECONDS, "--lora-seconds", TRAIN_SECONDS, "--threads", 1,
            env={"SPECOPS_MLFLOW_URI": f"sqlite:///{work}/mlflow.db",
                 "SPECOPS_MLFLOW_ARTIFACTS": str(work / "mlartifacts"), "SPECOPS_CACHE": cache},
        )  # fmt: skip
    print(f"specops loop demo took {time.perf_counter() - started:.0f} s")
    return result, work


def _registry(work: Path, monkeypatch):
    from registry.client import Registry

    monkeypatch.setenv("SPECOPS_MLFLOW_URI", f"sqlite:///{work}/mlflow.db")
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", str(work / "mlartifacts"))
    return Registry()


@pytest.mark.slow  # the main job on the tiny target (~1 min, once per module)
def test_the_main_job_runs_end_to_end_on_the_tiny_target(demo, loop_world, monkeypatch):
    result, work = demo
    assert result.exit_code == 0, result.output
    assert "bootstrap champion: specops-draft-ngram/1" in result.output
    assert "results: results/main/loop.json, plot results/main/loop.png" in result.output
    assert "promoted by hand, its weights scrambled on disk" in result.output

    # The records: every replayed request, valid, before the drift, after it, then the
    # drill's (served by the damaged head).
    report = json.loads((loop_world / "results/main/loop.json").read_text())
    flow = report["flow_result"]
    drill = flow["drill"]
    drilled = drill["collected"]["replayed"]["written"]
    rows = sorted((row for _, row in read_raw(work / "store")), key=lambda r: r["timestamp"])
    assert [r["workload"] for r in rows] == ["grounded"] * DEMO["before_prompts"] + [
        "humaneval"
    ] * (DEMO["after_prompts"] + drilled)
    assert {r["drafter_version"] for r in rows[: DEMO["before_prompts"]]} == {
        "specops-draft-ngram/1"
    }
    assert all(len(r["output_token_ids"]) <= DEMO["max_new_tokens"] for r in rows)

    # The report: the series, the before/after figures and the flow's result beside them.
    assert list(report) == [
        "acceptance_over_time", "before_after", "daily_retrain", "regained", "bootstrap",
        "drill", "flow_result",
    ]  # fmt: skip
    assert [p["request"] for p in report["acceptance_over_time"]] == list(range(1, len(rows) + 1))
    assert report["bootstrap"] == "specops-draft-ngram/1"
    assert list(flow) == ["bootstrap", "phases", "daily_retrain", "retrained", "drill"]
    assert flow["bootstrap"]["promoted"] == "specops-draft-ngram/1"
    before, after = flow["phases"]
    assert before["replayed"]["written"] == DEMO["before_prompts"]
    assert after["replayed"]["written"] == DEMO["after_prompts"]
    assert after["validation"]["validation"]["valid"] == len(rows) - drilled
    retrained = flow["retrained"]
    assert retrained["slot"] in ("demo-phase-2", "demo-daily-2")
    assert retrained.get("scheduled") is (True if retrained["slot"] == "demo-daily-2" else None)
    families = [c["family"] for c in retrained["challengers"]]
    assert families == ["suffix", "head", "lora"], retrained["trained"]
    ba = report["before_after"]
    assert ba["champion_before"] == retrained["decision"]["champion"]
    assert {c["label"] for c in ba["challengers"]} == {c["label"] for c in retrained["challengers"]}
    assert set(ba["gates"]) == {c["label"] for c in retrained["challengers"]}
    png = (loop_world / "results/main/loop.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000

    # The drill: the retrain's head evaluated, promoted by hand over the champion the
    # retrain left, its weights scrambled where serving loads them, then a collect whose
    # watch judged it. (Whether the tiny target's head collapses is chance: a whole one
    # rolled back is tests/flows/test_loop_flows.py's.) When the retrain promoted the head
    # itself, the drill finds it serving: not evaluated or promoted again, and what it
    # displaced is the champion before the retrain (as for a drill run again,
    # tests/flows/test_loop_flows.py).
    (head,) = [c for c in retrained["challengers"] if c["family"] == "head"]
    assert drill["skipped"] is None and drill["draft"] == head["label"]
    assert drill["scrambled"]
    if ba["promoted"] == head["label"]:
        assert drill["displaced"] == ba["champion_before"] and drill["evaluated"] is None
    else:
        assert drill["displaced"] == (ba["promoted"] or ba["champion_before"])
        assert drill["evaluated"]["promoted"] is None
    assert drill["collected"]["replayed"]["champion"] == head["label"] and drilled > 0
    assert drill["collected"]["watch"]["champion"] == head["label"]
    assert drill["collected"]["validation"]["validation"]["valid"] == len(rows)
    assert report["drill"]["draft"] == head["label"] and report["drill"]["requests"] == drilled
    assert all(r["drafter_version"] == head["label"] for r in rows if r["run_id"] == "demo-drill")

    # The registry: the champion alias where the drill left it, the report logged.
    registry = _registry(work, monkeypatch)
    restored = report["drill"]["restored"]
    assert registry.champion("cpu").label == (drill["displaced"] if restored else head["label"])
    for challenger in retrained["challengers"]:
        assert registry.get(challenger["family"], challenger["version"]).evaluated_on("cpu")
    (run,) = registry.client.search_runs(
        [registry.experiment_id], filter_string="attributes.run_name = 'drift-demo'"
    )
    files = {f.path for f in registry.client.list_artifacts(run.info.run_id)}
    assert {"loop.json", "loop.png"} <= files
    assert run.data.tags["hardware"] == "cpu"


@pytest.mark.slow  # the main job on the tiny target (~1 min, once per module)
def test_the_main_job_does_what_it_did_before_the_refactor(demo, loop_world):
    """The same records (token ids, steps, acceptance) and decisions (triggers, gates,
    promotions, watch) as the baseline. A difference is a change of behaviour: the run's
    own digest is written beside the workspace, to compare or, for a change meant, to
    replace the baseline with."""
    result, work = demo
    assert result.exit_code == 0, result.output
    actual = loop_digest(work / "store", loop_world / "results/main/loop.json")
    expected = json.loads(BEHAVIOUR.read_text())
    assert outline(actual) == outline(expected)  # on every CPU
    require_recorded_cpu_kind()  # the token ids and numbers: where they were recorded
    found = list(differences(expected, actual))
    if found:
        written = loop_world / BEHAVIOUR.name
        written.write_text(dumps(actual))
        shown = "\n  ".join(found[:5]) + ("\n  ..." if len(found) > 5 else "")
        pytest.fail(
            f"the main job's behaviour differs from {BEHAVIOUR.relative_to(BEHAVIOUR.parents[3])} "
            f"in {len(found)} place(s); the first:\n  {shown}\nthis run's digest: {written}",
            pytrace=False,
        )


@pytest.mark.slow  # the main job on the tiny target (~1 min, once per module)
def test_head_curve_continues_the_demos_head(demo, loop_world):
    _, work = demo
    out = loop_world / "head-curve"
    result = _invoke("head-curve", "--work", work, "--minutes", 0.02, "--out", out, "--threads", 1)
    assert result.exit_code == 0, result.output
    payload = json.loads((out / "head-continuation.json").read_text())
    assert payload["drifted_workload"] == "humaneval" and payload["heldout_sequences"] >= 1
    (start, *marks) = payload["runs"]["continued"]
    assert (start["seconds"], start["steps"]) == (0.0, 0) and "wall_s" not in start
    assert marks and all(point["steps"] >= 1 and "wall_s" in point for point in marks)
    assert start["mean_accepted_length"] == payload["pre_drift"]["mean_accepted_length"]
    assert (out / "head-continuation.png").read_bytes().startswith(b"\x89PNG")
    assert f"results: {out / 'head-continuation.json'}" in result.output


def test_head_curve_refuses_a_workspace_without_a_head(loop_world):
    result = _invoke("head-curve", "--work", loop_world / "empty", "--minutes", 0.02)
    assert result.exit_code == 2
    assert "no head is registered" in result.output and "specops loop demo" in result.output
    result = _invoke("head-curve", "--minutes", 0)
    assert result.exit_code == 2 and "--minutes must be > 0, got 0.0" in result.output


@pytest.mark.slow  # the main job on the tiny target (~1 min, once per module)
def test_run_evaluates_a_registered_version_and_prints_the_decision(demo, loop_world, monkeypatch):
    _, work = demo
    registry = _registry(work, monkeypatch)
    champion = registry.champion("cpu").label
    result = _invoke(
        "run", "evaluate-and-promote", "--challenger", "suffix/1", "--workload", "grounded",
        "--prompts", 4, "--no-traffic", "--no-promote", "--work", loop_world / "run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    printed = result.stdout  # the decision's JSON (its first 4,000 characters)
    assert printed.startswith('{\n  "hardware": "cpu",\n  "labels": {')
    assert '"challenger-0": "specops-draft-suffix/1"' in printed
    assert f'"champion": "{champion}",\n  "promoted": null,' in printed  # --no-promote
    assert '"gates": {\n    "specops-draft-suffix/1": {\n      "passed": ' in printed
    assert registry.by_alias("suffix", "challenger-cpu").label == "specops-draft-suffix/1"
    assert registry.champion("cpu").label == champion


@pytest.mark.slow  # the main job on the tiny target (~1 min, once per module)
def test_run_collect_validates_versions_and_weighs_a_retrain(demo, loop_world, monkeypatch):
    _, work = demo
    _registry(work, monkeypatch)  # the demo's registry, through the environment
    store = work.relative_to(loop_world) / "store"  # inside the project, as `data` is
    # The demo's retrains were just recorded: a trigger now is held back by the cool-down
    # (360 minutes), so collect validates, versions and decides without retraining.
    result = _invoke("run", "collect", "--store", store, "--work", loop_world / "collect")
    assert result.exit_code == 0, result.output
    printed = result.stdout  # the flow's result as JSON (its first 4,000 characters)
    assert printed.startswith('{\n  "replayed": null,\n  "retention": {')
    assert '"removed": []' in printed  # nothing is 30 days old
    valid = sum(1 for _ in read_raw(work / "store"))  # before, after the drift, the drill's
    assert valid > DEMO["before_prompts"] + DEMO["after_prompts"]
    assert '"validation": {\n    "validation": {\n      "schema_version": 3,' in printed
    assert f'"total": {valid},\n      "valid": {valid},' in printed
    meta = yaml.safe_load((loop_world / f"{store}.dvc").read_text())  # `git add` records it
    assert meta["outs"][0]["md5"].endswith(".dir")


def test_run_refuses_what_it_cannot_run(loop_world):
    result = _invoke("run", "nonsense")
    assert result.exit_code == 2 and "unknown flow 'nonsense'" in result.output
    result = _invoke("run", "collect", "--hardware", "tpu-v9")
    assert result.exit_code == 2 and "tpu-v9" in result.output
    result = _invoke(
        "run", "evaluate-and-promote", "--workload", "grounded", "--work", loop_world / "none"
    )
    assert result.exit_code == 2 and "no held-out traffic" in result.output


def test_serve_refuses_an_unknown_target_before_prefect_starts():
    result = _invoke("serve", "--hardware", "tpu-v9")
    assert result.exit_code == 2 and "unknown hardware target 'tpu-v9'" in result.output


@pytest.mark.slow  # its own process and the Prefect server
def test_serve_registers_its_scheduled_deployments_and_stops(harness, tmp_path):
    """``specops loop serve`` in its own process against the test's Prefect server: its
    three deployments appear with their schedules; interrupted, it stops."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    server = subprocess.Popen(
        [sys.executable, "-m", "specops", "loop", "serve", "--hardware", "cpu-stock"],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        found: dict[str, object] = {}
        deadline = time.monotonic() + 240
        with get_client(sync_client=True) as client:
            while len(found) < 3 and time.monotonic() < deadline and server.poll() is None:
                time.sleep(2)
                found = {
                    f"{client.read_flow(d.flow_id).name}/{d.name}": d
                    for d in client.read_deployments()
                }
        assert server.poll() is None, server.stdout.read() if server.stdout else ""
        assert set(found) == {"collect/hourly", "retrain/daily", "evaluate-and-promote/on-demand"}
        for name, cron in (("collect/hourly", "0 * * * *"), ("retrain/daily", "30 3 * * *")):
            deployment = found[name]
            (schedule,) = deployment.schedules  # type: ignore[attr-defined]
            assert schedule.schedule.cron == cron
            assert deployment.parameters["hardware"] == "cpu-stock"  # type: ignore[attr-defined]
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert server.returncode is not None
