"""The GPU run kit rehearsed on the CPU: built here from a registry's bundle and a
dataset's training mix (the target a tiny model, its budgets tiny, parts of 1 MiB), every
step run through ``run.sh`` as it runs on a GPU machine, and the results ingested into a
temporary registry (curves written, the evaluation logged and gated, ``docs/gpu/``
rendered)."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from transformers import AutoTokenizer

from serving.engine.drafters.package import DraftManifest, write_package
from serving.hardware import HARDWARE_CONFIG, hardware_target, load_hardware
from serving.records.schema import parse_record
from tasks.data.dataset import part_path
from tasks.evaluate.evaluate import EncodedPrompt
from tasks.gpu.kit import KitOptions, build_kit, plan_text
from tasks.gpu.manifest import MIB, KitSettings
from tasks.gpu.plan import STEPS
from tasks.loop.retrain_config import FamilySettings, TargetRetrain
from tests.tasks.data.test_validate import make_record

pytestmark = pytest.mark.slow  # every step of the kit, on the tiny target: ~2 min

TEXTS = [
    "Write a Python function that adds two numbers and returns the sum.",
    "List three fruits, one per line, then list them again in the same order.",
]
TRAIN = {"batch_size": 2, "max_seq_len": 48, "eval_every": 3, "checkpoint_every": 3,
         "eval_fraction": 0.0}  # fmt: skip
RETRAIN = TargetRetrain(
    families=["head", "lora"],
    threads=1,
    min_sequences=2,
    min_answer_tokens=8,
    head=FamilySettings(budget_seconds=1.0, settings=TRAIN),
    lora=FamilySettings(
        budget_seconds=1.0, settings={**TRAIN, "layers": 1, "loss": "ce", "lora_r": 2,
                                      "lora_alpha": 4},
    ),
)  # fmt: skip


@pytest.fixture
def registry(tmp_path, monkeypatch):
    from registry.client import Registry

    monkeypatch.setenv("SPECOPS_MLFLOW_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", str(tmp_path / "mlartifacts"))
    monkeypatch.setenv("SPECOPS_CACHE", str(tmp_path / "cache"))
    return Registry()


def _bundle(registry, model_folder, tmp_path):
    from tasks.loop.remote_bundle import prepare_bundle

    package = write_package(
        tmp_path / "pld", DraftManifest(drafter="pld:3", family="ngram", k=4, policy="fixed")
    )
    draft = registry.log_draft(package, family="ngram")
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    prompts = [
        EncodedPrompt(f"p{i}", "grounded", tokenizer.encode(text)) for i, text in enumerate(TEXTS)
    ]
    return prepare_bundle(
        registry, hardware_target("cpu"), [draft], prompts, tmp_path / "bundle",
        tokenizer=tokenizer, cache=tmp_path / "cache", max_new_tokens=8,
    )  # fmt: skip


def _dataset(tmp_path):
    path = part_path(tmp_path / "dataset", "train_mix")
    path.parent.mkdir(parents=True)
    rows = [
        make_record(i, id=f"r{i}", prompt_token_ids=[3 + i, 10, 11, 12],
                    output_token_ids=[20 + i % 5] * 12)
        for i in range(6)
    ]  # fmt: skip
    path.write_text(
        "".join(json.dumps(parse_record(r).model_dump(mode="json")) + "\n" for r in rows)
    )
    return tmp_path / "dataset"


def test_the_kit_rehearses_on_the_cpu_and_comes_back(registry, long_context_folder, tmp_path):
    from tasks.gpu.ingest import ingest

    kit = tmp_path / "kit"
    manifest = build_kit(
        KitOptions(
            out=kit,
            bundle=_bundle(registry, long_context_folder, tmp_path),
            target=str(long_context_folder),
            dataset=_dataset(tmp_path),
            part_size=MIB,
            wheels=False,
            settings=KitSettings(
                threads=1, repeats=3, max_n=4, context=32, bench_max_new_tokens=8,
                bench_prompts=2, train_budget_s=1.0, total_s=900,
                # Only tests that need a GPU (skipped here): the suite runs the others.
                tests=("tests/serving/lean/test_graphed.py::test_captured_passes_decode_exactly_on_the_gpu",),
            ),
            retrain=RETRAIN,
        ),
        say=lambda line: None,
    )  # fmt: skip
    # Every part within 1 MiB; the model (a 13 MB tiny target) in several.
    assert all(p.bytes <= MIB for f in manifest.files.values() for p in f.parts)
    assert len(manifest.files["model"].parts) > 1
    assert {"code", "model", "bundle", "teacher"} <= set(manifest.files)
    plan = plan_text(manifest)
    assert all(step.name in plan for step in STEPS) and "total: ~" in plan

    # There: the two commands a lent machine runs, through run.sh.
    results = tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable, "RESULTS": str(results)}
    for command in ("measure", "learn"):
        done = subprocess.run(
            ["bash", str(kit / "run.sh"), command], env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((results / "logs").glob("*"))
        )
        assert done.returncode == 0, done.stdout + done.stderr + logs
    ledger = json.loads((results / "steps.json").read_text())["steps"]
    assert {name: s["status"] for name, s in ledger.items()} == {s.name: "ok" for s in STEPS}
    assert "2 skipped" in json.loads((results / "tests.json").read_text())["summary"]
    assert "not importable" in json.loads((results / "vllm.json").read_text())["reason"]
    trained = json.loads((results / "trained.json").read_text())
    assert set(trained) == {"head", "lora"} and all(t.get("package") for t in trained.values())
    bench = json.loads((results / "bench" / "bench.json").read_text())
    methods = {row["method"] for row in bench["summary"]}
    assert {"hf-greedy", "hf-static", "specops-pld"} <= methods
    assert all(row["identical"] for row in bench["summary"])  # greedy: every output the same

    # Back here: curves into (a copy of) configs/hardware.yaml, the evaluation logged.
    hardware_config = tmp_path / "hardware.yaml"
    hardware_config.write_text(HARDWARE_CONFIG.read_text())
    plots = tmp_path / "measurements" / "gpu"
    done = ingest(
        results,
        hardware_config=hardware_config,
        docs=tmp_path / "docs",
        plots=plots,
        registry=registry,
    )
    profile = json.loads((results / "profile.json").read_text())
    assert load_hardware(hardware_config).targets["cpu"].verify_curve == profile["config_curve"]
    assert yaml.safe_load(hardware_config.read_text())["targets"]["cpu"]["batch_curve"]
    assert done.curves == ["verify_curve", "batch_curve"]
    assert set(done.registered) == {"challenger-0", "trained-head", "trained-lora"}
    for label in done.registered.values():
        draft = registry.resolve(label)
        assert draft.evaluated_on("cpu"), label
    doc = (tmp_path / "docs" / "cpu.md").read_text()
    assert "Champion on `cpu`" in doc and "| trained-lora |" in doc
    assert "vLLM: nothing evaluated. cpu-vllm not evaluated: vLLM is not importable" in doc
    assert (plots / "cpu-bench.png").is_file()
    assert "![bench](../measurements/gpu/cpu-bench.png)" in doc
    # A second ingest of the same results registers nothing twice.
    again = ingest(
        results,
        hardware_config=hardware_config,
        docs=tmp_path / "docs",
        plots=plots,
        registry=registry,
        promote=False,
    )
    assert again.registered == done.registered
