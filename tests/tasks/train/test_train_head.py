"""Training the draft head on the tiny target's teacher data: learning, determinism,
resuming, and the documented errors. Prompts are random token ids (tests only)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from pydantic import ValidationError

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.head import HeadDrafter
from serving.engine.policy import FixedK
from serving.errors import BadInputError, IncompatibleDraftError, ModelSourceError
from serving.models.head import load_head
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget
from tasks.train.teacher import (
    MANIFEST,
    TeacherConfig,
    TeacherManifest,
    target_fingerprint,
)
from tasks.train.train_head import (
    CHECKPOINT_FILE,
    HEAD_DIR,
    METRICS_FILE,
    TrainHeadConfig,
    evaluate_head,
    train_head,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def teacher_dir(target, tiny_teacher_cache, tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher")
    return tiny_teacher_cache(target, path, prompts=24, prompt_len=8, max_new_tokens=24, seed=0)


def config(teacher_dir, output_dir, **overrides) -> TrainHeadConfig:
    settings = {
        "teacher_dir": teacher_dir,
        "output_dir": output_dir,
        "max_steps": 20,
        "batch_size": 4,
        "learning_rate": 1e-2,
        "token_weight": 1.0,
        "intermediate_size": 48,
        "eval_every": 10,
        "checkpoint_every": 10,
    }
    return TrainHeadConfig(**{**settings, **overrides})


def weights(result) -> dict[str, torch.Tensor]:
    return load_head(result.head_dir).state_dict()


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_training_lowers_the_loss_and_raises_agreement(target, teacher_dir, tmp_path):
    # Measured on the training sequences (eval_fraction=0): a random tiny target's answers
    # to random prompts are learnable but do not generalise from 24 sequences.
    result = train_head(
        config(teacher_dir, tmp_path, max_steps=150, eval_every=50, eval_fraction=0.0),
        target,
        progress=False,
    )
    first, last = result.history[0], result.final
    assert [m.step for m in result.history] == [0, 50, 100, 150]
    assert last.loss < 0.6 * first.loss
    assert last.agreement is not None and first.agreement is not None
    assert last.agreement > first.agreement + 0.25
    assert last.agreement_second is not None and last.agreement_second > 0.2
    assert result.train_tokens_per_s and result.steps == 150 and result.resumed_from is None
    assert {p.name for p in tmp_path.iterdir()} >= {CHECKPOINT_FILE, HEAD_DIR, METRICS_FILE}
    again = evaluate_head(load_head(result.head_dir, target), target, teacher_dir, batch_size=4)
    assert again.agreement == pytest.approx(last.agreement)
    assert again.agreement_second == pytest.approx(last.agreement_second)


def test_the_same_seed_gives_the_same_weights(target, teacher_dir, tmp_path):
    first = train_head(config(teacher_dir, tmp_path / "a"), target, progress=False)
    again = train_head(config(teacher_dir, tmp_path / "b"), target, progress=False)
    assert_same_weights(weights(first), weights(again))
    other = train_head(config(teacher_dir, tmp_path / "c", seed=1), target, progress=False)
    assert not torch.equal(weights(first)["fc.weight"], weights(other)["fc.weight"])


def test_resuming_continues_from_the_checkpoint(target, teacher_dir, tmp_path):
    straight = train_head(config(teacher_dir, tmp_path / "straight"), target, progress=False)
    half = train_head(
        config(teacher_dir, tmp_path / "resumed", max_steps=10), target, progress=False
    )
    assert half.steps == 10
    resumed = train_head(config(teacher_dir, tmp_path / "resumed"), target, progress=False)
    assert resumed.resumed_from == 10 and resumed.steps == 20
    assert_same_weights(weights(straight), weights(resumed))
    assert [m.step for m in resumed.history] == [m.step for m in straight.history]


def test_a_killed_run_resumes_from_its_last_checkpoint(target, teacher_dir, tmp_path):
    straight = train_head(config(teacher_dir, tmp_path / "straight"), target, progress=False)

    def kill(step, _metrics):
        if step == 13:  # after the checkpoint at step 10
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_head(config(teacher_dir, tmp_path / "killed"), target, progress=False, on_step=kill)
    assert not (tmp_path / "killed" / HEAD_DIR).exists()
    resumed = train_head(config(teacher_dir, tmp_path / "killed"), target, progress=False)
    assert resumed.resumed_from == 10
    assert_same_weights(weights(straight), weights(resumed))


def test_a_reduced_vocabulary_head_keeps_eos_and_drafts(target, teacher_dir, prompt, tmp_path):
    result = train_head(config(teacher_dir, tmp_path, draft_vocab_size=40), target, progress=False)
    head = load_head(result.head_dir, target)
    assert head.vocab_ids is not None and head.vocab_ids.shape == (40,)
    assert 2 in head.vocab_ids.tolist()  # the EOS id
    loaded = LoadedTarget.of(target)
    plain = SpeculativeDecoder(loaded).generate(prompt, max_new_tokens=16).token_ids
    decoder = SpeculativeDecoder(loaded, drafter=HeadDrafter(head, loaded), policy=FixedK(3))
    assert decoder.generate(prompt, max_new_tokens=16).token_ids == plain


def test_a_corrupt_checkpoint_is_reported(target, teacher_dir, tmp_path):
    train_head(config(teacher_dir, tmp_path, max_steps=2), target, progress=False)
    (tmp_path / CHECKPOINT_FILE / "model.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelSourceError, match=r"corrupt or unreadable.*delete it"):
        train_head(config(teacher_dir, tmp_path), target, progress=False)


def test_resuming_with_other_settings_is_refused(target, teacher_dir, tmp_path):
    train_head(config(teacher_dir, tmp_path, max_steps=10), target, progress=False)
    with pytest.raises(ModelSourceError, match=re.escape("learning_rate: 0.01 -> 0.001")):
        train_head(config(teacher_dir, tmp_path, learning_rate=1e-3), target, progress=False)


def test_missing_or_empty_teacher_data_is_reported(target, teacher_dir, tmp_path):
    with pytest.raises(BadInputError, match="no teacher cache at"):
        train_head(config(tmp_path / "nothing", tmp_path / "out"), target, progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    manifest = TeacherManifest(
        target=target_fingerprint(target), eos_token_ids=[2], config=TeacherConfig()
    )
    (empty / MANIFEST).write_text(manifest.model_dump_json())
    with pytest.raises(BadInputError, match="teacher data is empty"):
        train_head(config(empty, tmp_path / "out"), target, progress=False)


def test_a_target_of_another_shape_is_refused(teacher_dir, tmp_path):
    with pytest.raises(IncompatibleDraftError, match="hidden_size=32 but this target has"):
        train_head(config(teacher_dir, tmp_path), tiny_llama(hidden_size=48), progress=False)


def test_bad_settings_fail_at_load_time_naming_the_key(teacher_dir, tmp_path):
    with pytest.raises(ValidationError, match="max_steps"):
        config(teacher_dir, tmp_path, max_steps=0)
    with pytest.raises(ValidationError, match="token_loss"):
        config(teacher_dir, tmp_path, token_loss="kl")
    with pytest.raises(ValidationError, match="no_such_setting"):
        config(teacher_dir, tmp_path, no_such_setting=1)


def test_a_time_budget_stops_training_and_a_resumed_run_adds_to_its_clock(
    target, teacher_dir, tmp_path
):
    settings = config(teacher_dir, tmp_path, max_steps=10**6, eval_every=10**6)
    first = train_head(settings, target, progress=False, max_train_seconds=0.3)
    assert 0 < first.steps < 10**6 and first.train_seconds >= 0.3
    assert first.final.train_seconds == first.train_seconds
    assert first.final.train_tokens == first.train_tokens > 0
    more = train_head(settings, target, progress=False, max_train_seconds=0.6)
    assert more.resumed_from == first.steps < more.steps
    assert more.train_seconds >= 0.6 and more.train_tokens > first.train_tokens
    with pytest.raises(ValueError, match="time budget must be > 0"):
        train_head(settings, target, progress=False, max_train_seconds=0)


def test_the_training_depth_is_recorded_where_it_is_not_the_old_two(tmp_path):
    two = TrainHeadConfig(teacher_dir=tmp_path, output_dir=tmp_path)
    four = TrainHeadConfig(teacher_dir=tmp_path, output_dir=tmp_path, depths=4)
    assert "depths" not in json.loads(two.model_dump_json())  # as heads were written before
    assert json.loads(four.model_dump_json())["depths"] == 4
    assert TrainHeadConfig.model_validate(json.loads(four.model_dump_json())).depths == 4
