"""Continuing a trained draft head (``init_head``) on new teacher data of the tiny target:
where it starts, its kept vocabulary, training on, resuming, and the refusals."""

from __future__ import annotations

import re

import pytest
import torch

from serving.engine.drafters.package import DraftManifest, write_package
from serving.errors import IncompatibleDraftError, ModelSourceError
from serving.models.head import DraftHead, head_config_for, load_head, save_head
from serving.models.tiny import tiny_llama
from tasks.train.train_head import INIT_HEAD_DIR, TrainHeadConfig, train_head

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def teacher_dir(target, tiny_teacher_cache, tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher")
    return tiny_teacher_cache(target, path, prompts=24, prompt_len=8, max_new_tokens=24, seed=0)


@pytest.fixture(scope="module")
def new_teacher_dir(target, tiny_teacher_cache, tmp_path_factory):
    """Other prompts: the newly collected data a head is continued on."""
    path = tmp_path_factory.mktemp("new-teacher")
    return tiny_teacher_cache(
        target, path, prompts=16, prompt_len=8, max_new_tokens=24, seed=1, prefix="q"
    )


def config(teacher_dir, output_dir, **overrides) -> TrainHeadConfig:
    settings = {
        "teacher_dir": teacher_dir,
        "output_dir": output_dir,
        "max_steps": 20,
        "batch_size": 4,
        "learning_rate": 1e-2,
        "token_weight": 1.0,
        "intermediate_size": 48,
        "draft_vocab_size": 40,
        "eval_every": 10,
        "checkpoint_every": 10,
    }
    return TrainHeadConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def trained(target, teacher_dir, tmp_path_factory):
    """A head trained on the first data: what a later run continues."""
    output = tmp_path_factory.mktemp("first")
    return train_head(config(teacher_dir, output, max_steps=60), target, progress=False)


def weights(path) -> dict[str, torch.Tensor]:
    return load_head(path).state_dict()


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_continued_head_starts_from_the_init_heads_weights_and_vocabulary(
    target, trained, new_teacher_dir, tmp_path
):
    # The warm-up's first step runs at learning rate 0: after it the weights are still the
    # ones the run started from.
    settings = {"max_steps": 1, "warmup_steps": 5}
    continued = train_head(
        config(new_teacher_dir, tmp_path / "continued", init_head=trained.head_dir, **settings),
        target,
        progress=False,
    )
    start = weights(trained.head_dir)
    assert_same_weights(weights(continued.head_dir), start)
    assert_same_weights(weights(tmp_path / "continued" / INIT_HEAD_DIR), start)
    # A fresh run on the new data would have picked another reduced vocabulary.
    fresh = train_head(config(new_teacher_dir, tmp_path / "fresh", **settings), target,
                       progress=False)  # fmt: skip
    fresh_vocab = weights(fresh.head_dir)["vocab_ids"]
    assert not torch.equal(fresh_vocab, start["vocab_ids"])
    # Evaluated at step 0 on the new data, the trained head is already ahead of random.
    assert continued.history[0].loss < fresh.history[0].loss


def test_a_head_package_can_be_continued(target, trained, new_teacher_dir, tmp_path):
    package = write_package(
        tmp_path / "package",
        DraftManifest(drafter="head:head", family="head", k=3),
        {"head": trained.head_dir},
    )
    continued = train_head(
        config(new_teacher_dir, tmp_path / "out", init_head=package, max_steps=1, warmup_steps=5),
        target,
        progress=False,
    )
    assert_same_weights(weights(continued.head_dir), weights(trained.head_dir))
    not_a_head = write_package(tmp_path / "pld", DraftManifest(drafter="pld:3"))
    with pytest.raises(IncompatibleDraftError, match="drafter 'pld:3', not of a head"):
        train_head(config(new_teacher_dir, tmp_path / "x", init_head=not_a_head), target,
                   progress=False)  # fmt: skip


def test_continuing_trains_on(target, trained, new_teacher_dir, tmp_path):
    result = train_head(
        config(new_teacher_dir, tmp_path, init_head=trained.head_dir, max_steps=30,
               eval_fraction=0.0),
        target,
        progress=False,
    )  # fmt: skip
    first, last = result.history[0], result.final
    assert result.steps == 30 and result.resumed_from is None
    assert last.loss < first.loss
    assert last.agreement is not None and first.agreement is not None
    assert last.agreement > first.agreement
    head = load_head(result.head_dir, target)
    assert head.vocab_ids is not None
    assert torch.equal(head.vocab_ids, weights(trained.head_dir)["vocab_ids"])


def test_a_resumed_run_takes_the_checkpoint_not_init_head(
    target, teacher_dir, trained, new_teacher_dir, tmp_path
):
    source = tmp_path / "source"
    save_head(load_head(trained.head_dir), source)
    straight = train_head(
        config(new_teacher_dir, tmp_path / "straight", init_head=source), target, progress=False
    )
    half = train_head(
        config(new_teacher_dir, tmp_path / "resumed", init_head=source, max_steps=10),
        target,
        progress=False,
    )
    assert half.steps == 10
    # The head at init_head is replaced meanwhile (a later run wrote another one there).
    other = train_head(config(teacher_dir, tmp_path / "other", max_steps=5, seed=3), target,
                       progress=False)  # fmt: skip
    save_head(load_head(other.head_dir), source)
    resumed = train_head(
        config(new_teacher_dir, tmp_path / "resumed", init_head=source), target, progress=False
    )
    assert resumed.resumed_from == 10 and resumed.steps == 20
    assert_same_weights(weights(straight.head_dir), weights(resumed.head_dir))
    # Another init_head (another folder) is ignored as well: the checkpoint wins.
    longer = train_head(
        config(new_teacher_dir, tmp_path / "resumed", init_head=tmp_path / "elsewhere",
               max_steps=25),
        target,
        progress=False,
    )  # fmt: skip
    assert longer.resumed_from == 20 and longer.steps == 25


def test_a_fresh_runs_checkpoint_resumes_fresh_whatever_init_head_says(
    target, trained, new_teacher_dir, tmp_path
):
    straight = train_head(config(new_teacher_dir, tmp_path / "straight"), target, progress=False)
    train_head(config(new_teacher_dir, tmp_path / "resumed", max_steps=10), target,
               progress=False)  # fmt: skip
    resumed = train_head(
        config(new_teacher_dir, tmp_path / "resumed", init_head=trained.head_dir),
        target,
        progress=False,
    )
    assert resumed.resumed_from == 10
    assert_same_weights(weights(straight.head_dir), weights(resumed.head_dir))
    assert not (tmp_path / "resumed" / INIT_HEAD_DIR).exists()


def test_a_head_of_another_shape_is_refused_naming_both(target, trained, new_teacher_dir, tmp_path):
    def run(**overrides):
        settings = {"init_head": trained.head_dir, **overrides}
        return train_head(config(new_teacher_dir, tmp_path / "out", **settings), target,
                          progress=False)  # fmt: skip

    with pytest.raises(
        IncompatibleDraftError, match=re.escape("intermediate_size: head 48, config 64")
    ):
        run(intermediate_size=64)
    with pytest.raises(
        IncompatibleDraftError, match=re.escape("draft_vocab_size: head 40, config None")
    ):
        run(draft_vocab_size=None)
    with pytest.raises(IncompatibleDraftError, match="draft_vocab_size: head 40, config 30"):
        run(draft_vocab_size=30)
    assert not (tmp_path / "out" / INIT_HEAD_DIR).exists()
    # A head for another target is refused by load_head's own check.
    other = tiny_llama(hidden_size=16, num_heads=2, num_kv_heads=1)
    foreign = save_head(DraftHead(head_config_for(other, intermediate_size=48)), tmp_path / "f")
    with pytest.raises(IncompatibleDraftError, match="hidden size 16"):
        run(init_head=foreign, draft_vocab_size=None)
    with pytest.raises(ModelSourceError, match="is not a draft-head folder"):
        run(init_head=tmp_path / "nothing")
