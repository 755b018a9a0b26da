"""A head scored on a teacher cache through the path that serves: on a lean target the
replay of the lean head step's drafts is what decoding with the head drafter measures."""

from __future__ import annotations

import pytest

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.head import HeadDrafter
from serving.engine.policy import FixedK
from serving.errors import BadInputError
from serving.models.head import save_head
from tasks.evaluate.head_score import score_head
from tasks.train.teacher import load_teacher_data
from tests.serving.lean.models import tiny_target
from tests.tasks.evaluate.test_offline_acceptance import NEW_TOKENS, engine_replay
from tests.tasks.lean_heads import EOS, lean_teacher_and_head

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


@pytest.fixture(scope="module")
def lean(lean_int4):
    return lean_int4


@pytest.fixture(scope="module")
def scored(lean, tmp_path_factory):
    """A teacher cache answered and featured on the lean target, and a head trained on it."""
    root = tmp_path_factory.mktemp("score")
    teacher, _, result = lean_teacher_and_head(
        lean, root, prompts=12, new_tokens=NEW_TOKENS, seed=4
    )
    return teacher, result.head_dir


def test_the_served_replay_is_what_decoding_measures(lean, scored):
    teacher, head_dir = scored
    score = score_head(head_dir, teacher, lean, k=4)
    assert score.drafted_by == "lean head step on cpu-int4"
    assert score.features_from == "cpu-int4"
    from serving.models.head import load_head

    drafter = HeadDrafter(load_head(head_dir, lean.model), lean)
    decoder = SpeculativeDecoder(lean, drafter=drafter, policy=FixedK(4), eos_token_ids=[EOS])
    _, sequences = load_teacher_data(teacher)
    online = engine_replay(decoder, sequences)
    tokens, steps = online.tokens, online.steps
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
