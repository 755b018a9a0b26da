"""``specops train-draft`` / ``eval-draft`` on a tiny target saved as a local model folder
with a character tokenizer (both made here, for tests only)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from serving.atomic import write_jsonl_atomic
from serving.engine.drafters.package import DraftManifest, read_manifest, write_package
from serving.models.tiny import tiny_llama
from serving.records.schema import RequestRecord, Sampling
from serving.records.store import partition_dir
from specops.draft_cli import register_draft_commands
from tasks.train.distill import CHECKPOINT_FILE
from tasks.train.loop import LOOP_STATE_FILE
from tasks.train.teacher import TeacherConfig
from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache

runner = CliRunner()
app = typer.Typer()
register_draft_commands(app)


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def teacher_dir(target_dir, tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    generator = torch.Generator().manual_seed(0)
    prompts = [
        TeacherPrompt(f"p{i}", torch.randint(3, 96, (8,), generator=generator).tolist())
        for i in range(16)
    ]
    path = tmp_path_factory.mktemp("teacher")
    build_teacher_cache(
        model, prompts, path, eos_token_ids=[2], config=TeacherConfig(max_new_tokens=16),
        progress=False,
    )  # fmt: skip
    return path


def train_args(target_dir, teacher_dir, out, kind="lora", *extra):
    return [
        "train-draft", "--kind", kind, "--out", out, "--target", target_dir,
        "--teacher", teacher_dir, "--layers", 2, "--steps", 6, "--batch-size", 4,
        "--max-seq-len", 32, "--lr", 1e-2, "--checkpoint-every", 3, "--eval-every", 3,
        "--threads", 1, *extra,
    ]  # fmt: skip


def assert_fails(result, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output
    # One error line, last (transformers' loading bars may come before it on stderr).
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.output.strip().endswith(errors[0]), result.output


# ------------------------------------------------------------------------------ training


@pytest.mark.parametrize("kind", ["lora", "full", "head"])
def test_train_draft_writes_a_package(target_dir, teacher_dir, tmp_path, kind):
    out = tmp_path / "package"
    result = invoke(*train_args(target_dir, teacher_dir, out, kind))
    assert result.exit_code == 0, result.output
    assert f"{kind} draft: 6 steps" in result.output and "held-out agreement" in result.output
    manifest = read_manifest(out)
    assert manifest.family == kind and manifest.k == 5 and manifest.policy == "cost"
    # A LoRA of the target's first layers ships its adapter alone, merged when it loads.
    drafters = {"head": "head:head", "lora": "lora:adapter", "full": "model:weights"}
    assert manifest.drafter == drafters[kind]
    assert (tmp_path / "package.work" / CHECKPOINT_FILE / LOOP_STATE_FILE).is_file()
    if kind == "full":  # the full model ships with the target's tokenizer
        assert (out / "weights" / "tokenizer.json").is_file()
    assert (kind == "lora") == (out / "adapter" / "lora_base.json").is_file()


def _record(index: int, split: str = "train") -> dict:
    return RequestRecord(
        schema_version=3, id=f"req-{index}", prompt_id=f"p{index}", workload="sharegpt",
        split=split, prompt="hi", prompt_token_ids=[1, 5, 6], output_text="...",
        output_token_ids=[10 + index, 11, 12, 13], from_draft=[False] * 4,
        acceptance_rate=None, mean_accepted_length=1.0, draft_tokens=0, accepted_tokens=0,
        checks=4, steps=[[0, 0]] * 4, is_failure=False, failure_threshold=0.5,
        drafter="none", drafter_version="builtin", policy="fixed", hardware="cpu",
        sampling=Sampling(temperature=0.0, top_k=0, top_p=1.0, seed=None),
        timestamp=time.time() - 100 + index, run_id="r", disagreements=[],
        drafted=[], unverified=[],
    ).model_dump(mode="json")  # fmt: skip


def test_train_draft_suffix_indexes_the_store(tmp_path):
    store = tmp_path / "store"
    rows = [_record(0), _record(1), _record(2, split="heldout")]
    write_jsonl_atomic(partition_dir(store, "cpu", time.time()) / "part-r-00000.jsonl", rows)
    out = tmp_path / "suffix"
    result = invoke("train-draft", "--kind", "suffix", "--out", out, "--store", store, "--k", 4)
    assert result.exit_code == 0, result.output
    assert "suffix draft: 2 sequences, 8 tokens" in result.output
    manifest = read_manifest(out)
    assert (manifest.drafter, manifest.family, manifest.k) == ("suffix:corpus.json", "suffix", 4)
    assert json.loads((out / "corpus.json").read_text())["sequences"] == 2


def test_train_draft_ngram_carries_its_shared_store_in_the_package(tmp_path, target):
    from serving.engine.drafters.factory import build_drafter
    from serving.target import LoadedTarget

    store = tmp_path / "store"
    rows = [_record(0), _record(1), _record(2, split="heldout")]
    write_jsonl_atomic(partition_dir(store, "cpu", time.time()) / "part-r-00000.jsonl", rows)
    out = tmp_path / "ngram"
    result = invoke(
        "train-draft", "--kind", "ngram", "--out", out, "--store", store, "--ngram-n", 3,
        "--min-conf", 0.25, "--k", 4,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "n-gram store of 2 sequences, 8 tokens" in result.output
    manifest = read_manifest(out)
    assert manifest.drafter == "ngram:3,fallback=shared,min_conf=0.25,store=store.json"
    spec = manifest.spec(out)  # the store resolves inside the package
    drafter = build_drafter(spec, LoadedTarget.of(target))
    described = drafter.describe()
    assert described["fallback"] == "shared" and described["store"] == str(out / "store.json")
    assert described["min_confidence"] == 0.25 and described["store_contexts"] > 0
    target_only = invoke("train-draft", "--kind", "ngram", "--out", tmp_path / "t",
                         "--fallback", "target")  # fmt: skip
    assert target_only.exit_code == 0, target_only.output
    assert read_manifest(tmp_path / "t").drafter == "ngram:4,fallback=target"


@pytest.mark.parametrize(
    ("args", "needle"),
    [(("--fallback", "maybe"), "'maybe' is not one of"), (("--ngram-n", 1), "must be >= 2"),
     (("--min-conf", 2), "min_conf=2 is not in [0, 1]")],
)  # fmt: skip
def test_train_draft_ngram_refuses_bad_options(tmp_path, args, needle):
    result = invoke("train-draft", "--kind", "ngram", "--out", tmp_path / "n", *args)
    assert result.exit_code != 0 and needle in result.output


# ---------------------------------------------------------------------------- evaluation


def test_eval_draft_reports_and_writes_json(target_dir, teacher_dir, tmp_path):
    package = tmp_path / "lora"
    # A fixed k: the cost policy rightly declines to draft with half the tiny target's layers.
    fixed = ("--policy", "fixed", "--k", 3)
    assert invoke(*train_args(target_dir, teacher_dir, package, "lora", *fixed)).exit_code == 0
    baseline = write_package(tmp_path / "pld", DraftManifest(drafter="pld:3", k=4))
    out = tmp_path / "eval.json"
    result = invoke(
        "eval-draft", package, "--baseline-package", baseline, "--workload", "sharegpt",
        "--prompts", 2, "--max-new-tokens", 8, "--threads", 1, "--target", target_dir,
        "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 held-out prompts x 8 tokens on cpu" in result.output
    assert result.output.count("lossless yes") == 2
    assert "acceptance by position: [" in result.output and "speedup" in result.output
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"plain", "draft", "baseline"}
    assert report["results"]["draft"]["lossless"] and report["results"]["draft"]["draft_tokens"]
    assert report["workload"] == "sharegpt" and report["threads"] == 1
    assert report["command"].startswith("specops eval-draft")


# -------------------------------------------------------------------------------- errors


def test_train_draft_errors(target_dir, teacher_dir, tmp_path, monkeypatch):
    out = tmp_path / "package"
    assert_fails(invoke("train-draft", "--kind", "medusa", "--out", out), "unknown kind 'medusa'")
    assert_fails(invoke(*train_args(target_dir, tmp_path / "none", out)), "no teacher cache at")
    assert_fails(
        invoke(*train_args(target_dir, teacher_dir, out, "lora", "--loss", "mse")),
        "bad settings: loss",
    )
    assert_fails(
        invoke(*train_args(target_dir, teacher_dir, out, "full", "--quantize", "4bit")),
        "needs kind='lora'",
    )
    assert_fails(
        invoke(*train_args(target_dir, teacher_dir, out, "lora", "--policy", "magic")),
        "unknown policy 'magic'",
    )
    assert_fails(
        invoke(*train_args(target_dir, teacher_dir, out, "lora", "--layers", 9)),
        "layers:N needs 1 <= N < 4",
    )
    other = tmp_path / "other-vocab"
    tiny_llama(vocab_size=128, num_layers=1).save_pretrained(other)
    assert_fails(
        invoke(*train_args(target_dir, teacher_dir, out, "lora", "--draft-model", other)),
        "vocabulary of 128 tokens",
    )
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    assert_fails(
        invoke(*train_args(target_dir, teacher_dir, out, "lora", "--quantize", "8bit")),
        "pip install bitsandbytes",
    )
    assert not out.exists()


def test_train_draft_reports_a_corrupt_checkpoint(target_dir, teacher_dir, tmp_path):
    work = tmp_path / "work"
    (work / CHECKPOINT_FILE).mkdir(parents=True)
    (work / CHECKPOINT_FILE / LOOP_STATE_FILE).write_bytes(b"garbage")
    result = invoke(
        *train_args(target_dir, teacher_dir, tmp_path / "p", "lora", "--work-dir", work)
    )
    assert_fails(result, "is corrupt or unreadable")


def test_train_draft_reports_another_targets_teacher_data(teacher_dir, hf_char_tokenizer, tmp_path):
    other = tmp_path / "other-target"
    tiny_llama(seed=3).save_pretrained(other)
    hf_char_tokenizer.save_pretrained(other)
    result = invoke(*train_args(other, teacher_dir, tmp_path / "p"))
    assert_fails(result, "recorded from another target")


def test_train_draft_suffix_on_an_empty_store(tmp_path):
    (tmp_path / "store").mkdir()
    result = invoke(
        "train-draft", "--kind", "suffix", "--out", tmp_path / "s", "--store", tmp_path / "store"
    )
    assert_fails(result, "no token sequences to index")


def test_eval_draft_errors(target_dir, tmp_path):
    package = write_package(tmp_path / "pld", DraftManifest(drafter="pld:3", k=4))
    assert_fails(invoke("eval-draft", tmp_path), "draft.json is missing")
    assert_fails(invoke("eval-draft", package, "--prompts", 0), "--prompts must be >= 1")
    assert_fails(
        invoke("eval-draft", package, "--max-new-tokens", 0), "--max-new-tokens must be >= 1"
    )
    assert_fails(
        invoke("eval-draft", package, "--workload", "poetry", "--target", target_dir),
        "unknown workload 'poetry'",
    )
    assert_fails(
        invoke("eval-draft", package, "--hardware", "tpu", "--target", target_dir),
        "unknown hardware target 'tpu'",
    )
    assert_fails(
        invoke("eval-draft", package, "--baseline-package", tmp_path / "nothing"),
        "draft.json is missing",
    )
    # A model draft of another vocabulary fails when the package is built against the target.
    weights = tmp_path / "other-weights"
    tiny_llama(vocab_size=128, num_layers=1).save_pretrained(weights)
    other = write_package(
        tmp_path / "other", DraftManifest(drafter="model:weights"), {"weights": weights}
    )
    result = invoke("eval-draft", other, "--prompts", 1, "--target", target_dir, "--threads", 1)
    assert_fails(result, "vocabulary of 128 tokens")


def test_train_draft_builds_the_teacher_cache_first(target_dir, tmp_path):
    teacher = tmp_path / "teacher"
    args = train_args(target_dir, teacher, tmp_path / "package", "lora")
    build = ["--build-teacher", 3, "--teacher-new-tokens", 8, "--max-prompt-tokens", 400]
    result = invoke(*args, *build)
    assert result.exit_code == 0, result.output
    assert (teacher / "manifest.json").is_file()
    assert read_manifest(tmp_path / "package").family == "lora"
    assert_fails(invoke(*args, "--build-teacher", 0), "--build-teacher needs N >= 1")


def test_train_draft_stops_on_its_time_budget(target_dir, teacher_dir, tmp_path):
    args = train_args(target_dir, teacher_dir, tmp_path / "p", "head")
    at = args.index("--steps")
    del args[at : at + 2]  # with --minutes, no step limit
    result = invoke(*args, "--minutes", 0.005)
    assert result.exit_code == 0, result.output
    assert "head draft:" in result.output and " min); held-out" in result.output
    assert_fails(invoke(*args, "--minutes", 0), "--minutes must be > 0, got 0")
