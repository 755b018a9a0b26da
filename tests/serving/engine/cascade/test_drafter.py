"""The cascade on tiny models: lossless for every stage order, with and without the
predictor; stopping stages counted; bad stage lists and predictors refused up front."""

from __future__ import annotations

import itertools

import pytest

from serving.engine.build import build_decoder
from serving.engine.cascade.build import build_cascade, parse_stages
from serving.engine.cascade.drafter import TARGET_STAGE
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.plan import CascadePlan
from serving.engine.predictor import PredictorError
from serving.errors import BadInputError
from serving.target import LoadedTarget
from tests.serving.engine.cascade.conftest import tiny_predictor

NEW_TOKENS = 48
STAGES = ("suffix", "pld:2", "ngram:3", "layers:1")


def _decoder(target: LoadedTarget, stages, predictor=None):
    plan = CascadePlan.parse(list(stages))
    cascade = build_cascade(plan, target, predictor=predictor)
    return build_decoder(target, plan, drafter=cascade), cascade


@pytest.mark.parametrize("order", list(itertools.permutations(STAGES)))
@pytest.mark.parametrize("with_predictor", [False, True])
def test_cascade_is_lossless_for_every_stage_order(
    cascade_target, prompt, greedy_reference, order, with_predictor
):
    predictor = tiny_predictor() if with_predictor else None
    decoder, cascade = _decoder(cascade_target, order, predictor)
    result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS)
    assert result.token_ids == greedy_reference
    # every step stopped somewhere: at a stage's block, or at the target alone
    assert sum(cascade.stops.values()) == result.stats.checks
    assert set(cascade.stops) <= {*order, TARGET_STAGE}


def test_every_single_stage_is_lossless(cascade_target, prompt, greedy_reference, predictor):
    for stage in STAGES:
        decoder, _ = _decoder(cascade_target, [stage], predictor)
        assert decoder.generate(prompt, max_new_tokens=NEW_TOKENS).token_ids == greedy_reference


def test_a_model_stage_drafts_and_is_verified(cascade_target, prompt, greedy_reference):
    # The target's own first layers as the only stage: its drafts get accepted.
    decoder, _ = _decoder(cascade_target, ["layers:2"], None)
    result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, mode="detailed")
    assert result.token_ids == greedy_reference
    assert result.stats.draft_tokens > 0
    assert result.record is not None
    stages = {row.stage for row in result.record.drafted}
    assert stages == {"model"}
    assert all(row.stage_index == 0 for row in result.record.drafted)


def test_detailed_records_carry_the_chosen_stage(cascade_target, prompt):
    decoder, _ = _decoder(cascade_target, ["pld:2", "layers:2"], None)
    result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, mode="detailed")
    drafted = result.record.drafted
    assert drafted, "the cascade drafted nothing"
    assert {(row.stage, row.stage_index) for row in drafted} <= {("pld", 0), ("model", 1)}
    for row in drafted:
        assert row.kept == row.accepted  # lossless: nothing kept unverified


def test_each_step_names_the_stage_it_verified_and_the_stats_sum_them(cascade_target, prompt):
    decoder, _ = _decoder(cascade_target, ["pld:2", "layers:2"], None)
    result = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, mode="detailed")
    drafted = [step for step in result.steps if step.proposed]
    assert drafted and {step.stage for step in drafted} <= {"pld", "model"}
    assert all(step.stage is None for step in result.steps if not step.proposed)
    by_stage = result.stats.accepted_by_stage
    assert sum(by_stage.values()) == result.stats.accepted_tokens
    kept = {stage: 0 for stage in by_stage}  # the detailed record's own count, per token
    for row in result.record.drafted:
        kept[row.stage] = kept.get(row.stage, 0) + row.accepted
    assert {stage: n for stage, n in kept.items() if n} == {s: n for s, n in by_stage.items() if n}


@pytest.mark.parametrize(
    "stages, message",
    [
        ("", "empty"),
        ([], "empty"),
        (" , ", "empty"),
        ("suffix,warp:3", "unknown drafter"),
        ("pld,none", "'none' is not a cascade stage"),
        ("pld:3,pld:3", "appears twice"),
    ],
)
def test_bad_stage_lists_are_refused(stages, message):
    with pytest.raises(BadInputError, match=message):
        parse_stages(stages)


def test_a_predictor_for_another_target_or_feature_set_is_refused(cascade_target, tmp_path):
    folder = tiny_predictor(hardware="cuda").save(tmp_path / "p")
    assert cascade_target.name == "cpu"
    with pytest.raises(PredictorError, match="hardware target 'cuda', not 'cpu'"):
        build_cascade(CascadePlan.parse("pld", predictor=folder), cascade_target)
    narrow = tiny_predictor(stages=("pld",)).save(tmp_path / "narrow")
    with pytest.raises(PredictorError, match="never seen"):
        build_cascade(CascadePlan.parse("pld,suffix", predictor=narrow), cascade_target)
    meta = (folder / "predictor.json").read_text().replace("specops-features/1", "old/0")
    (folder / "predictor.json").write_text(meta)
    with pytest.raises(PredictorError, match="feature set 'old/0'"):
        build_cascade(CascadePlan.parse("pld", predictor=folder), cascade_target)


class _Trusts:
    """A predictor that gives one stage's tokens certain acceptance and every other stage's
    none: the plan then never verifies another stage's block (which still drafts: both
    stages here are eager)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def predict(self, rows):
        import torch

        return torch.tensor([1.0 if row.stage == self.stage else 0.0 for row in rows])


def test_stages_not_chosen_still_learn_where_the_target_ruled(cascade_target, prompt):
    decoder, cascade = _decoder(cascade_target, ["pld:2", "ngram:3"], None)
    cascade.predictor = _Trusts("ngram")
    decoder.generate(prompt * 3, max_new_tokens=NEW_TOKENS)
    chosen = {name for name in cascade.stops if name != TARGET_STAGE}
    assert chosen == {"ngram:3"}, cascade.stops  # pld:2 never verified, ngram:3 was
    for index, stage in enumerate(cascade.stages):
        assert sum(cascade.running[index].seen) > 0, (stage.name, chosen)


@pytest.mark.slow  # a statistical test: thousands of sampled tokens
def test_sampling_through_the_cascade_keeps_the_targets_distribution(cascade_target, prompt):
    """Two-sample chi-square: the first two sampled tokens through a cascade whose model
    stage drafts (and whose n-gram stage may) against plain sampling, over many seeds."""
    import numpy as np
    from scipy.stats import chi2_contingency

    from serving.engine.sampling import SamplingParams

    plain = SpeculativeDecoder(cascade_target)
    decoder, cascade = _decoder(cascade_target, ["pld:2", "layers:2"], None)
    trials = 800
    counts = {name: {} for name in ("plain", "cascade")}
    for seed in range(trials):
        sampling = SamplingParams(temperature=1.0, seed=seed)
        for name, engine in (("plain", plain), ("cascade", decoder)):
            key = tuple(engine.generate(prompt, max_new_tokens=2, sampling=sampling).token_ids)
            counts[name][key] = counts[name].get(key, 0) + 1
    assert cascade.stops.get("layers:2", 0) or sum(cascade.running[1].seen) > 0
    keys = sorted(set(counts["plain"]) | set(counts["cascade"]))
    table = np.array([[counts[n].get(k, 0) for k in keys] for n in ("plain", "cascade")])
    # Merge rare pairs so every expected count is at least 5.
    common = table.sum(axis=0) >= 10
    merged = np.column_stack([table[:, common], table[:, ~common].sum(axis=1)])
    assert chi2_contingency(merged).pvalue > 1e-3
