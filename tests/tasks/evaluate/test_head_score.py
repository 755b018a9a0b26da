"""A head scored on a teacher cache through the path that serves: on a lean target the
replay of the lean head step's drafts is what decoding with the head drafter measures."""

from __future__ import annotations

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.head import HeadDrafter
from serving.engine.policy import FixedK
from serving.errors import BadInputError
from serving.models.head import save_head
from tasks.evaluate.head_score import score_head
from tasks.train.teacher import TeacherConfig, load_teacher_data
from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache
from tasks.train.train_head import TrainHeadConfig, train_head
from tests.serving.lean.models import tiny_target

NEW_TOKENS = 24
EOS = 2

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def lean():
    return tiny_target("int4", hidden_size=32, intermediate_size=64, num_layers=4)


@pytest.fixture(scope="module")
def scored(lean, tmp_path_factory):
    """A teacher cache answered and featured on the lean target, and a head trained on it."""
    folder = tmp_path_factory.mktemp("score")
    generator = torch.Generator().manual_seed(4)
    prompts = [
        TeacherPrompt(f"p{i}", torch.randint(3, 96, (6,), generator=generator).tolist())
        for i in range(12)
    ]
    build_teacher_cache(
        lean, prompts, folder / "teacher", eos_token_ids=[EOS],
        config=TeacherConfig(max_new_tokens=NEW_TOKENS, feature_dtype="float32"), progress=False,
    )  # fmt: skip
    config = TrainHeadConfig(
        teacher_dir=folder / "teacher", output_dir=folder / "run", max_steps=60, batch_size=4,
        learning_rate=1e-2, token_weight=1.0, intermediate_size=48, eval_fraction=0.0,
        eval_every=60, checkpoint_every=60, depths=4,
    )  # fmt: skip
    head_dir = train_head(config, lean.model, progress=False).head_dir
    return folder / "teacher", head_dir


def test_the_served_replay_is_what_decoding_measures(lean, scored):
    teacher, head_dir = scored
    score = score_head(head_dir, teacher, lean, k=4)
    assert score.drafted_by == "lean head step on cpu-int4"
    assert score.features_from == "cpu-int4"
    from serving.models.head import load_head

    drafter = HeadDrafter(load_head(head_dir, lean.model), lean)
    decoder = SpeculativeDecoder(lean, drafter=drafter, policy=FixedK(4), eos_token_ids=[EOS])
    steps = tokens = 0
    _, sequences = load_teacher_data(teacher)
    for sequence in sequences:
        prompt = sequence.tokens[: sequence.prompt_len].tolist()
        result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS)
        assert result.token_ids == sequence.tokens[sequence.prompt_len :].tolist()
        steps += len(result.steps)
        tokens += sum(s.emitted for s in result.steps)
    assert score.mean_accepted_length == pytest.approx(tokens / steps, abs=1e-12)
    assert score.mean_accepted_length > 1.0  # the trained head gets drafts accepted
    assert score.sequences == 12 and 0.0 < (score.agreement or 0.0) <= 1.0


def test_bad_k_or_a_folder_without_a_head_is_named(lean, scored, tmp_path):
    teacher, head_dir = scored
    with pytest.raises(BadInputError, match="k must be in"):
        score_head(head_dir, teacher, lean, k=0)
    with pytest.raises(BadInputError, match="neither a draft-head folder"):
        score_head(tmp_path, teacher, lean, k=2)


def test_a_head_for_another_target_is_refused(lean, scored, tmp_path):
    from serving.errors import IncompatibleDraftError
    from serving.models.head import DraftHead, head_config_for

    teacher, _ = scored
    other = tiny_target("int4", hidden_size=64, intermediate_size=64, num_layers=2)
    save_head(DraftHead(head_config_for(other.model, intermediate_size=32)), tmp_path / "h")
    with pytest.raises(IncompatibleDraftError, match="hidden size"):
        score_head(tmp_path / "h", teacher, lean, k=2)
