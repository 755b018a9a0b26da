"""The learned challengers on the tiny target: trained from records, skipped with a reason
when the data is too small, and resumed from their checkpoints when run again."""

import pytest

import tasks.loop.learned as learned
from serving.engine.drafters.package import read_manifest
from serving.hardware import engine_target
from serving.records.schema import RequestRecord, parse_record
from tasks.loop.retrain_config import FamilySettings, TargetRetrain
from tests.tasks.data.test_validate import make_record

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = TargetRetrain(
    families=["head", "lora"],
    min_sequences=2,
    min_answer_tokens=8,
    head=FamilySettings(
        budget_seconds=1.0,
        settings={
            "batch_size": 2,
            "max_seq_len": 48,
            "eval_every": 3,
            "checkpoint_every": 3,
            "eval_fraction": 0.0,
        },
    ),
    lora=FamilySettings(
        budget_seconds=1.0,
        settings={
            "layers": 1,
            "loss": "ce",
            "lora_r": 2,
            "lora_alpha": 4,
            "batch_size": 2,
            "max_seq_len": 48,
            "eval_every": 3,
            "checkpoint_every": 3,
            "eval_fraction": 0.0,
        },
    ),
)


@pytest.fixture
def tiny(monkeypatch, loaded_on):
    stock = loaded_on(engine_target(learned.TRAINING_HARDWARE))
    monkeypatch.setattr(learned, "training_target", lambda target_name="smollm2": stock)


def records(n: int) -> list[RequestRecord]:
    return [
        parse_record(
            make_record(
                i,
                id=f"r{i}",
                prompt_token_ids=[3 + i, 10, 11, 12],
                output_token_ids=[20 + i % 5] * 12,
            )
        )
        for i in range(n)
    ]


def test_too_little_data_skips_every_family_with_the_reason(tiny, tmp_path):
    trained = learned.train_learned_challengers(records(1), tmp_path, CONFIG, progress=False)
    assert [(t.family, t.package) for t in trained] == [("head", None), ("lora", None)]
    assert all("at least 2 sequences" in t.skipped for t in trained)


@pytest.mark.slow
def test_both_families_train_and_a_rerun_resumes_from_their_checkpoints(tiny, tmp_path):
    first = learned.train_learned_challengers(records(6), tmp_path, CONFIG, progress=False)
    assert [t.family for t in first] == ["head", "lora"]
    for trained in first:
        assert trained.skipped is None and read_manifest(trained.package).family == trained.family
        steps = [s for s, _ in trained.curves["train/loss"]]
        assert steps[0] == 0 and steps == sorted(steps) and trained.params["steps"] >= 1
    # Killed and run again in the same slot: each family continues from its checkpoint.
    longer = CONFIG.with_budgets({"head": 2.0, "lora": 2.0})
    again = learned.train_learned_challengers(records(6), tmp_path, longer, progress=False)
    for before, after in zip(first, again, strict=True):
        assert after.params["resumed_from"] == before.params["steps"]
        assert after.params["steps"] >= before.params["steps"]


def test_the_head_continues_from_a_given_head(tiny, tmp_path):
    (pre,) = [t for t in learned.train_learned_challengers(records(6), tmp_path / "a", CONFIG,
              progress=False) if t.family == "head"]  # fmt: skip
    head_only = CONFIG.model_copy(update={"families": ["head"]})
    (cont,) = learned.train_learned_challengers(
        records(6), tmp_path / "b", head_only, init_head=pre.package / "head", progress=False
    )
    assert cont.params["init"] == str(pre.package / "head")


def test_a_step_bound_ends_training_after_that_many_optimiser_steps(tiny, tmp_path):
    """``max_steps`` beside a budget it cannot reach: exactly that many steps, on any
    machine; run again in the same slot, nothing is left to train."""
    bounded = TargetRetrain(
        families=["head", "lora"],
        min_sequences=2,
        min_answer_tokens=8,
        head=CONFIG.family("head").model_copy(update={"budget_seconds": 600.0, "max_steps": 4}),
        lora=CONFIG.family("lora").model_copy(update={"budget_seconds": 600.0, "max_steps": 2}),
    )
    first = learned.train_learned_challengers(records(6), tmp_path, bounded, progress=False)
    assert [(t.family, t.params["steps"]) for t in first] == [("head", 4), ("lora", 2)]
    assert [s for s, _ in first[0].curves["train/loss"]] == [0, 3, 4]  # eval_every 3, last
    again = learned.train_learned_challengers(records(6), tmp_path, bounded, progress=False)
    assert [(t.params["steps"], t.params["resumed_from"]) for t in again] == [(4, 4), (2, 2)]
