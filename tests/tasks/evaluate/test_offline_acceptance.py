"""Replayed acceptance must be what the engine measures: a draft head and a model draft on
the tiny target, replayed on the target's recorded greedy answers, give the same target
steps and tokens as decoding those prompts through the engine."""

from __future__ import annotations

import pytest

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.head import HeadDrafter
from serving.engine.drafters.model import ModelDrafter
from serving.engine.policy import FixedK
from serving.models.head import load_head
from serving.models.truncated import first_layers
from serving.target import LoadedTarget
from tasks.evaluate.offline_acceptance import Replay, head_hits, model_hits, replay, replay_all
from tasks.train.head_data import split_sequences
from tasks.train.head_loss import frozen_target
from tasks.train.teacher import load_teacher_data
from tasks.train.train_head import TrainHeadConfig, train_head

NEW_TOKENS = 24


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def recorded(target, tiny_teacher_cache, tmp_path_factory):
    """The tiny target's greedy answers to 16 random prompts, recorded."""
    path = tmp_path_factory.mktemp("recorded")
    tiny_teacher_cache(target, path, prompts=16, prompt_len=6, max_new_tokens=NEW_TOKENS, seed=1)
    _, sequences = load_teacher_data(path)
    return path, sequences


def engine_replay(decoder: SpeculativeDecoder, sequences) -> Replay:
    """Target steps and the tokens they produced, decoding each recorded prompt."""
    steps = tokens = 0
    for sequence in sequences:
        prompt = sequence.tokens[: sequence.prompt_len].tolist()
        result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert result.token_ids == sequence.tokens[sequence.prompt_len :].tolist()
        steps += len(result.steps)
        tokens += sum(s.emitted for s in result.steps)
    return Replay(steps, tokens, 0, 0)


def test_replay_counts_accepted_drafts_plus_the_targets_token():
    always, never = [[True] * 12] * 2, [[False] * 12] * 2
    # prompt 2, length 12: the 10 answer tokens 2..11 come 3, 3, 3, 1 per step with k = 2.
    assert (replay(always, 2, 12, 2).steps, replay(always, 2, 12, 2).tokens) == (4, 10)
    assert (replay(never, 2, 12, 2).steps, replay(never, 2, 12, 2).tokens) == (10, 10)
    assert replay(always, 2, 12, 1).mean_accepted_length == pytest.approx(10 / 5)
    assert replay(always, 2, 12, 2).agreement == 1.0 and replay(never, 2, 12, 2).agreement == 0
    # A second draft only counts after a right first one.
    second_only = [[False] * 12, [True] * 12]
    assert replay(second_only, 2, 12, 2).tokens == replay(never, 2, 12, 2).tokens
    with pytest.raises(ValueError, match="k must be"):
        replay(always, 2, 12, 3)


def test_model_draft_replay_equals_the_engine(target, recorded):
    _, sequences = recorded
    draft = first_layers(target, 1)
    offline = replay_all(lambda s: model_hits(draft, s, 2), sequences, 2)
    loaded = LoadedTarget.of(target)
    decoder = SpeculativeDecoder(
        loaded, drafter=ModelDrafter(loaded.over(draft)), policy=FixedK(2), eos_token_ids=[2]
    )
    online = engine_replay(decoder, sequences)
    assert (offline.steps, offline.tokens) == (online.steps, online.tokens)
    assert 1.0 < offline.mean_accepted_length < 3.0  # some drafts land, not all


def _trained_head(target, teacher, output, **settings):
    """A head briefly trained on the recorded answers (60 steps)."""
    config = TrainHeadConfig(
        teacher_dir=teacher,
        output_dir=output,
        max_steps=60,
        batch_size=4,
        learning_rate=1e-2,
        token_weight=1.0,
        intermediate_size=48,
        eval_fraction=0.0,
        eval_every=60,
        checkpoint_every=60,
        **settings,
    )
    return load_head(train_head(config, target, progress=False).head_dir, target)


def test_head_replay_equals_the_engine(target, recorded, tmp_path):
    path, sequences = recorded
    head = _trained_head(target, path, tmp_path)
    frozen = frozen_target(target, head.vocab_ids)
    sequences, _ = split_sequences(sequences, 0.0)
    offline = replay_all(lambda s: head_hits(head, s, frozen), sequences, 2)
    loaded = LoadedTarget.of(target)
    decoder = SpeculativeDecoder(
        loaded, drafter=HeadDrafter(head, loaded), policy=FixedK(2), eos_token_ids=[2]
    )
    online = engine_replay(decoder, sequences)
    assert (offline.steps, offline.tokens) == (online.steps, online.tokens)
    assert offline.mean_accepted_length > 1.0  # the trained head gets drafts accepted


def test_a_head_trained_four_deep_replays_four_drafts_as_the_engine_decodes(
    target, recorded, tmp_path
):
    path, sequences = recorded
    head = _trained_head(target, path, tmp_path, depths=4)
    frozen = frozen_target(target, head.vocab_ids)
    sequences, _ = split_sequences(sequences, 0.0)
    offline = replay_all(lambda s: head_hits(head, s, frozen, depths=4), sequences, 4)
    loaded = LoadedTarget.of(target)
    decoder = SpeculativeDecoder(
        loaded, drafter=HeadDrafter(head, loaded), policy=FixedK(4), eos_token_ids=[2]
    )
    online = engine_replay(decoder, sequences)
    assert (offline.steps, offline.tokens) == (online.steps, online.tokens)
    assert offline.mean_accepted_length > 1.0
