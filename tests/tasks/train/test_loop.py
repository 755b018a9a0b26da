"""The training loop on a tiny regression module (no real model): exact resumes, what the
checkpoint holds, atomic saves, the resume guard, the loss check, the time budget and the
evaluation and checkpoint cadence."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import accelerate.accelerator
import pytest
import torch
from safetensors.torch import load_file

import tasks.train.loop
from serving.errors import ModelSourceError
from tasks.train.loop import (
    CHECKPOINT_DIR,
    LEGACY_CHECKPOINT,
    LOOP_STATE_FILE,
    LoopConfig,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    TrainRun,
    run_training,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


class TinyConfig(LoopConfig):
    max_steps: PositiveInt = 8
    batch_size: PositiveInt = 4
    max_seq_len: PositiveInt = 1  # unused: a batch is one row per example
    learning_rate: PositiveFloat = 0.05
    warmup_steps: NonNegativeInt = 2
    eval_every: PositiveInt = 4
    checkpoint_every: PositiveInt = 3


@dataclass(frozen=True)
class TinyBatch:
    inputs: torch.Tensor  # [batch, 4]
    targets: torch.Tensor  # [batch]

    def to(self, device: torch.device) -> TinyBatch:
        return TinyBatch(self.inputs.to(device), self.targets.to(device))

    @property
    def tokens(self) -> int:
        return self.inputs.shape[0]


@dataclass(frozen=True)
class TinyMetrics:
    step: int
    loss: float
    agreement: float | None
    train_seconds: float = 0.0
    train_tokens: int = 0


class TinyModel(torch.nn.Module):
    """A frozen input layer, then a trainable one with dropout (it draws from torch's
    global generator, which a resume must restore)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 4).requires_grad_(False)
        self.body = torch.nn.Linear(4, hidden)
        self.dropout = torch.nn.Dropout(0.2)
        self.out = torch.nn.Linear(hidden, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:  # [batch, 4] -> [batch]
        return self.out(self.dropout(torch.relu(self.body(self.embed(inputs)))))[:, 0]


def regression_batch(rows: int, generator: torch.Generator) -> TinyBatch:
    inputs = torch.randn(rows, 4, generator=generator)
    return TinyBatch(inputs, inputs.sum(dim=-1))


@dataclass
class TinyTask:
    model: TinyModel
    batch_size: int
    nan_at_step: int | None = None
    metrics_type: type[TinyMetrics] = TinyMetrics
    steps_taken: int = 0

    def sample_batch(self, generator: torch.Generator) -> TinyBatch:
        return regression_batch(self.batch_size, generator)

    def batch_loss(self, model: TinyModel, batch: TinyBatch) -> torch.Tensor:
        self.steps_taken += 1
        loss = torch.nn.functional.mse_loss(model(batch.inputs), batch.targets)
        return loss * math.nan if self.steps_taken == self.nan_at_step else loss

    @torch.no_grad()
    def evaluate(self, model: TinyModel, step: int) -> TinyMetrics:
        model.eval()
        device = next(model.parameters()).device
        heldout = regression_batch(16, torch.Generator().manual_seed(99)).to(device)
        loss = float(torch.nn.functional.mse_loss(model(heldout.inputs), heldout.targets))
        model.train()
        return TinyMetrics(step=step, loss=loss, agreement=None)


def tiny_task(hidden: int = 8, **settings) -> TinyTask:
    torch.manual_seed(0)
    return TinyTask(TinyModel(hidden), batch_size=4, **settings)


def train(output_dir: Path, task: TinyTask | None = None, on_step=None, budget=None, **settings):
    config = TinyConfig(output_dir=output_dir, **settings)
    return run_training(
        config,
        task or tiny_task(),
        desc="tiny",
        progress=False,
        on_step=on_step,
        max_train_seconds=budget,
    )


def assert_same_weights(a: TrainRun, b: TrainRun) -> None:
    weights_a, weights_b = a.model.state_dict(), b.model.state_dict()
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name].cpu(), weights_b[name].cpu()), name


def assert_same_run(a: TrainRun, b: TrainRun) -> None:
    """Bitwise the same weights, history (but its seconds) and token count."""
    assert_same_weights(a, b)
    untimed = [replace(m, train_seconds=0.0) for m in a.history]
    assert untimed == [replace(m, train_seconds=0.0) for m in b.history]
    assert a.steps == b.steps and a.train_tokens == b.train_tokens


def checkpoint_step(output_dir: Path) -> int | None:
    state = output_dir / CHECKPOINT_DIR / LOOP_STATE_FILE
    return json.loads(state.read_text())["step"] if state.exists() else None


def kill_at(step: int):
    def on_step(at: int, _metrics) -> None:
        if at == step:
            raise KeyboardInterrupt

    return on_step


# -------------------------------------------------------------------------------- resume


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    straight = train(tmp_path / "straight")
    assert straight.resumed_from is None and straight.steps == 8
    half = train(tmp_path / "resumed", max_steps=4)  # evaluated at 4 either way
    assert half.steps == 4 and checkpoint_step(tmp_path / "resumed") == 4
    resumed = train(tmp_path / "resumed")
    assert resumed.resumed_from == 4
    assert_same_run(straight, resumed)
    # The run changed the weights (and so could differ).
    assert not torch.equal(straight.model.body.weight.cpu(), tiny_task().model.body.weight)


def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    straight = train(tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "killed", on_step=kill_at(5))  # after the checkpoint at step 3
    assert checkpoint_step(tmp_path / "killed") == 3
    resumed = train(tmp_path / "killed")
    assert resumed.resumed_from == 3
    assert_same_run(straight, resumed)


def test_a_run_killed_outright_mid_save_resumes(tmp_path):
    """SIGKILL during a save can leave a half-written scratch folder, and between the save's
    two renames only the previous checkpoint set aside: the next run tidies both up."""
    straight = train(tmp_path / "straight")
    out = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        train(out, on_step=kill_at(5))
    os.replace(out / CHECKPOINT_DIR, out / f".{CHECKPOINT_DIR}.old")
    (out / f".{CHECKPOINT_DIR}.x1y2.tmp").mkdir()
    (out / f".{CHECKPOINT_DIR}.x1y2.tmp" / "model.safetensors").write_bytes(b"half")
    resumed = train(out)
    assert resumed.resumed_from == 3
    assert_same_run(straight, resumed)
    assert sorted(os.listdir(out)) == [CHECKPOINT_DIR]


def test_another_seed_trains_other_weights(tmp_path):
    first, other = train(tmp_path / "a"), train(tmp_path / "b", seed=1)
    assert not torch.equal(first.model.body.weight.cpu(), other.model.body.weight.cpu())


def test_the_checkpoint_holds_only_the_trainable_weights(tmp_path):
    run = train(tmp_path)
    saved = load_file(tmp_path / CHECKPOINT_DIR / "model.safetensors")
    assert set(saved) == {"body.weight", "body.bias", "out.weight", "out.bias"}
    for name, tensor in saved.items():
        assert torch.equal(tensor, run.model.state_dict()[name].cpu()), name


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    straight = train(tmp_path / "straight")
    out = tmp_path / "failing"
    kept = tmp_path / "kept"
    real_save = accelerate.accelerator.save_custom_state
    calls = []

    def save_custom_state(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:  # the second checkpoint (step 6), after its weights are written
            raise OSError("disk full")
        real_save(*args, **kwargs)

    def copy_checkpoint(step, _metrics):
        if step == 4:  # the checkpoint of step 3, as written
            shutil.copytree(out / CHECKPOINT_DIR, kept)

    monkeypatch.setattr(accelerate.accelerator, "save_custom_state", save_custom_state)
    with pytest.raises(OSError, match="disk full"):
        train(out, on_step=copy_checkpoint)
    monkeypatch.undo()
    assert len(calls) == 3
    assert sorted(p.name for p in out.iterdir()) == [CHECKPOINT_DIR]  # no temporary left
    for file in kept.iterdir():
        assert (out / CHECKPOINT_DIR / file.name).read_bytes() == file.read_bytes(), file.name
    assert sorted(p.name for p in (out / CHECKPOINT_DIR).iterdir()) == sorted(
        p.name for p in kept.iterdir()
    )
    resumed = train(out)
    assert resumed.resumed_from == 3
    assert_same_run(straight, resumed)


# ------------------------------------------------------------------------------- refusals


def test_resuming_with_other_settings_names_them_before_loading(tmp_path, monkeypatch):
    train(tmp_path, max_steps=3)

    def no_loading(*_args, **_kwargs):
        raise AssertionError("loaded the checkpoint before checking its settings")

    with monkeypatch.context() as patch:
        patch.setattr(accelerate.Accelerator, "load_state", no_loading)
        with pytest.raises(
            ModelSourceError,
            match=re.escape("learning_rate: 0.05 -> 0.01, seed: 0 -> 1")
            + ".*use another output_dir or the same settings to resume",
        ):
            train(tmp_path, learning_rate=0.01, seed=1)
    resumed = train(tmp_path, max_steps=4, eval_every=1, checkpoint_every=1)  # resumable
    assert resumed.resumed_from == 3 and resumed.steps == 4


def test_a_model_of_other_shapes_is_refused(tmp_path):
    train(tmp_path, max_steps=3)
    with pytest.raises(
        ModelSourceError,
        match=r"holds other trainable weights than this model has \(other shapes: "
        r"body\.bias \(8,\) \(model \(6,\)\).*delete it to train from scratch",
    ):
        train(tmp_path, tiny_task(hidden=6))
    unfrozen = tiny_task()
    unfrozen.model.embed.requires_grad_(True)
    with pytest.raises(ModelSourceError, match=r"missing: embed\.bias, embed\.weight"):
        train(tmp_path, unfrozen)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished run's output folder (3 steps), to copy and damage."""
    out = tmp_path_factory.mktemp("finished")
    train(out, max_steps=3)
    return out


CHECKPOINT_FILES = [
    "model.safetensors",
    "optimizer.bin",
    "scheduler.bin",
    "random_states_0.pkl",
    "custom_checkpoint_0.pkl",
    "custom_checkpoint_1.pkl",
    LOOP_STATE_FILE,
]


def test_the_checkpoint_folder_holds_what_the_module_says(finished):
    assert sorted(p.name for p in (finished / CHECKPOINT_DIR).iterdir()) == sorted(CHECKPOINT_FILES)


@pytest.mark.parametrize("damage", ["garbage", "missing"])
@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_a_damaged_checkpoint_is_reported(finished, tmp_path, name, damage):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    file = out / CHECKPOINT_DIR / name
    if damage == "garbage":
        file.write_bytes(b"not a checkpoint")
    else:
        file.unlink()
    with pytest.raises(
        ModelSourceError,
        match=re.escape(f"checkpoint {out / CHECKPOINT_DIR} is corrupt or unreadable")
        + ".*; delete it to train from scratch$",
    ):
        train(out, max_steps=4)


def test_a_checkpoint_that_is_not_a_folder_is_reported(tmp_path):
    (tmp_path / CHECKPOINT_DIR).write_bytes(b"not a checkpoint")
    with pytest.raises(ModelSourceError, match="is corrupt or unreadable"):
        train(tmp_path)


def test_an_old_format_checkpoint_is_refused(tmp_path):
    (tmp_path / LEGACY_CHECKPOINT).write_bytes(b"an old torch.save checkpoint")
    with pytest.raises(
        ModelSourceError,
        match=re.escape(f"{tmp_path / LEGACY_CHECKPOINT} is a checkpoint of an earlier")
        + ".*delete it to train from scratch",
    ):
        train(tmp_path)


def test_a_non_finite_loss_raises_naming_the_step(tmp_path):
    with pytest.raises(FloatingPointError, match="the training loss became nan at step 3;"):
        train(tmp_path, tiny_task(nan_at_step=3), checkpoint_every=1)
    assert checkpoint_step(tmp_path) == 2  # nothing of step 3 was saved


# ------------------------------------------------------------------------- budget, cadence


def test_the_time_budget_stops_the_run_and_a_larger_one_resumes_it(tmp_path, monkeypatch):
    ticks = iter(range(10**6))
    monkeypatch.setattr(tasks.train.loop, "perf_counter", lambda: float(next(ticks)))
    settings = {"max_steps": 10**6, "eval_every": 10**6}  # each step takes one tick
    straight = train(tmp_path / "straight", budget=5, **settings)
    assert straight.steps == 5 and straight.train_seconds == 5.0
    first = train(tmp_path / "resumed", budget=3, **settings)
    assert first.steps == 3 and first.train_seconds == 3.0 and first.train_tokens == 12
    assert [m.step for m in first.history] == [0, 3]
    assert first.history[-1].train_seconds == 3.0 and first.history[-1].train_tokens == 12
    more = train(tmp_path / "resumed", budget=5, **settings)
    assert more.resumed_from == 3 and more.steps == 5
    assert more.train_seconds == 5.0 and more.train_tokens == 20 and more.tokens_per_s == 4.0
    assert [m.step for m in more.history] == [0, 3, 5]
    assert_same_weights(straight, more)
    with pytest.raises(ValueError, match="time budget must be > 0 seconds, got 0"):
        train(tmp_path / "none", budget=0)


def test_evaluation_and_checkpoint_cadence(tmp_path):
    seen: list[tuple[int, int | None]] = []  # (step, the checkpoint's step at that moment)

    def on_step(step: int, metrics: dict[str, float]) -> None:
        assert math.isfinite(metrics["loss"])
        seen.append((step, checkpoint_step(tmp_path)))

    run = train(tmp_path, on_step=on_step, max_steps=7, eval_every=3, checkpoint_every=2)
    assert [m.step for m in run.history] == [0, 3, 6, 7]  # step 0, every 3, the last
    assert seen == [(1, None), (2, None), (3, 2), (4, 2), (5, 4), (6, 4), (7, 6)]
    assert checkpoint_step(tmp_path) == 7  # and the last step
    again = train(tmp_path, max_steps=7, eval_every=3, checkpoint_every=2)
    assert again.resumed_from == 7 and again.steps == 7
    assert [m.step for m in again.history] == [0, 3, 6, 7]  # nothing trained, nothing added
