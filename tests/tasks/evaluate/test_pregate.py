"""The pre-gate: contenders decode against the target as recorded, so their steps (and
the modelled speed priced from them) are predicted without timing anything; a challenger
predicted to lose is not timed."""

from __future__ import annotations

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.head import HeadDrafter
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.errors import SpecOpsError
from serving.models.head import DraftHead, head_config_for
from serving.target import LoadedTarget
from tasks.evaluate.evaluate import Contender, evaluate_report
from tasks.evaluate.pregate import RecordedStep, predict

PROMPTS = [[1, 5, 17, 42, 8, 5, 17, 42, 33, 9, 5, 17], [3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [7, 8]]
CURVE = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]


def _steps(result):
    return [(s.proposed, s.accepted) for s in result.steps]


@pytest.mark.parametrize(
    "make",
    [
        lambda t: (PromptLookupDrafter(), FixedK(4)),
        lambda t: (build_drafter("layers:1", t), FixedK(3)),
    ],
)
def test_a_replay_takes_exactly_the_steps_of_a_real_run(target, make):
    loaded = LoadedTarget.of(target)
    drafter, policy = make(loaded)
    real = SpeculativeDecoder(loaded, drafter=drafter, policy=policy)
    recorded = RecordedStep(loaded.vocab_size, loaded.device)
    replay = SpeculativeDecoder(loaded.with_step(recorded), drafter=drafter, policy=policy)
    plain = SpeculativeDecoder(loaded)
    for prompt in PROMPTS:
        expected = real.generate(prompt, max_new_tokens=24)
        recorded.use(prompt + plain.generate(prompt, max_new_tokens=24).token_ids)
        got = replay.generate(prompt, max_new_tokens=24)
        assert got.token_ids == expected.token_ids
        assert _steps(got) == _steps(expected)


def test_a_head_reads_the_recorded_features():
    from serving.models.tiny import tiny_llama

    target = LoadedTarget.of(tiny_llama(num_layers=2))
    torch.manual_seed(0)
    head = DraftHead(head_config_for(target.model, intermediate_size=48)).eval()
    decoders = {
        "head": SpeculativeDecoder(target, drafter=HeadDrafter(head, target), policy=FixedK(2))
    }
    plain = SpeculativeDecoder(target)
    outputs = [plain.generate(p, max_new_tokens=16).token_ids for p in PROMPTS]
    predictions = predict(
        decoders, PROMPTS, outputs, target=target, curve=CURVE, draft_costs={"head": 0.1}
    )
    head_prediction = predictions["head"]
    assert head_prediction.reproduced == len(PROMPTS)  # emitted tokens are the recorded ones
    assert head_prediction.checks > 0 and head_prediction.speedup is not None


def test_past_the_recording_is_an_error(target):
    loaded = LoadedTarget.of(target)
    recorded = RecordedStep(loaded.vocab_size, loaded.device)
    recorded.use([1, 2, 3])
    replay = SpeculativeDecoder(loaded.with_step(recorded))
    with pytest.raises(SpecOpsError, match="past its 3 recorded tokens"):
        replay.generate([1, 2, 3, 4, 5], max_new_tokens=5)


def test_predicted_speedups_price_the_replayed_steps(target):
    target = LoadedTarget.of(target)
    plain = SpeculativeDecoder(target)
    outputs = [plain.generate(p, max_new_tokens=24).token_ids for p in PROMPTS]
    lookup = SpeculativeDecoder(target, drafter=PromptLookupDrafter(), policy=FixedK(4))
    predictions = predict(
        {"lookup": lookup, "none": SpeculativeDecoder(target)}, PROMPTS, outputs, target=target,
        curve=CURVE, draft_costs={"lookup": 0.0},
    )  # fmt: skip
    with pytest.raises(SpecOpsError, match="3 prompts but 2 recorded outputs"):
        predict({}, PROMPTS, outputs[:2], target=target, curve=CURVE, draft_costs={})
    assert predictions["none"].speedup == pytest.approx(1.0)  # a pass a token, as plain
    lookup_prediction = predictions["lookup"]
    assert lookup_prediction.reproduced == len(PROMPTS)
    assert lookup_prediction.tokens == predictions["none"].tokens


def test_prefills_are_priced_alike_for_plain_decoding_and_the_draft(target):
    target = LoadedTarget.of(target)
    plain = SpeculativeDecoder(target)
    outputs = [plain.generate(p, max_new_tokens=24).token_ids for p in PROMPTS]
    lookup = SpeculativeDecoder(target, drafter=PromptLookupDrafter(), policy=FixedK(4))
    free = predict({"lookup": lookup}, PROMPTS, outputs, target=target, curve=CURVE,
                   draft_costs={"lookup": 0.0})["lookup"]  # fmt: skip
    prefills = [5.0, 3.0, None]  # the last prompt's prefill unpriced
    priced = predict({"lookup": lookup}, PROMPTS, outputs, target=target, curve=CURVE,
                     draft_costs={"lookup": 0.0}, prefills=prefills)["lookup"]  # fmt: skip
    assert free.speedup is not None and priced.speedup is not None
    # Both costs grow by the same 8 passes: plain's cost is its tokens (a pass a token).
    checks_cost = free.tokens / free.speedup
    assert priced.speedup == pytest.approx((free.tokens + 8) / (checks_cost + 8))
    with pytest.raises(SpecOpsError, match="3 prompts but 2 prefill costs"):
        predict({}, PROMPTS, outputs, target=target, curve=CURVE, draft_costs={},
                prefills=[1.0, 1.0])  # fmt: skip


def test_a_challenger_predicted_to_lose_is_not_timed(tmp_path, evaluation_target, make_prompts):
    champion = write_package(tmp_path / "a", DraftManifest(drafter="pld:3", k=4, policy="cost"))
    # A draft model that is the target's first layer: it costs a share of a pass per drafted
    # token, and on repetitive text the lookup wins by far.
    loser = write_package(tmp_path / "b", DraftManifest(drafter="layers:1", k=4, policy="fixed"))
    prompts = make_prompts()
    report = evaluate_report(
        [Contender("champion", champion), Contender("challenger", loser)], prompts,
        target=evaluation_target, max_new_tokens=16,
        rounds=2, pregate_margin=0.0, progress=False,
    )  # fmt: skip
    predicted = report.predicted_speedups
    assert set(predicted) == {"champion", "challenger"}
    assert set(report.phase_s) == {"profile", "pregate", "timed"}
    if predicted["challenger"] >= predicted["champion"]:
        pytest.skip("on this tiny target the layer draft was predicted to win")
    assert report.untimed["challenger"].startswith("predicted modelled speedup")
    assert set(report.results) == {"plain", "champion"}  # the loser was never timed
    # Plain decoding was timed once, in the recording, not again in the rounds.
    assert all(len(run.round_seconds) == 1 for run in (report.per_prompt or {})["plain"])
    assert all(len(run.round_seconds) == 2 for run in (report.per_prompt or {})["champion"])
    assert "challenger" not in (report.per_prompt or {})
