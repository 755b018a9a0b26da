"""Shadow scores: registered drafts replayed over captured greedy records give exactly the
acceptance a real run on those requests gives; records a replay cannot reproduce are left
out and counted."""

from __future__ import annotations

import pytest

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.policy import FixedK
from serving.hardware import engine_target, hardware_target
from serving.records.schema import Sampling, parse_record
from tasks.loop.shadow import ShadowSettings, as_metrics, replayable, shadow_scores
from tests.tasks.data.test_validate import make_record

PROMPTS = [[1, 5, 17, 42, 8, 5, 17, 42, 33, 9, 5, 17], [3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [7, 8, 7]]


@pytest.fixture
def loaded(loaded_on):
    return loaded_on(engine_target("cpu"))


@pytest.fixture
def records(loaded):
    plain = SpeculativeDecoder(loaded)
    rows = []
    for index, prompt in enumerate(PROMPTS * 2):
        output = plain.generate(prompt, max_new_tokens=20).token_ids
        rows.append(
            make_record(
                index,
                id=f"r{index}",
                workload="live",
                prompt_token_ids=prompt,
                output_token_ids=output,
                output_text="x" * len(output),
                timestamp=1000.0 + index,
                from_draft=[False] * len(output),
                draft_tokens=0,
                accepted_tokens=0,
                acceptance_rate=None,
                mean_accepted_length=1.0,
                checks=len(output),
                steps=[[0, 0]] * len(output),
                disagreements=[],
                drafted=[],
            )
        )
    return [parse_record(row) for row in rows]


@pytest.mark.parametrize(("spec", "k"), [("pld:3", 4), ("layers:3", 3)])
def test_a_draft_scores_what_it_accepts_when_run_for_real(tmp_path, loaded, records, spec, k):
    """Prompt lookup (which the random tiny target never accepts) and the target's first
    three layers (often accepted): the replay's counts are a real run's."""
    package = write_package(tmp_path / "d", DraftManifest(drafter=spec, k=k, policy="fixed"))
    scores, skipped = shadow_scores(
        records, {"d/1": ("champion", package, {"cpu/draft_cost": "0.0"})}, target=loaded,
        settings=ShadowSettings(newest=3),
    )  # fmt: skip
    assert skipped == {}
    (score,) = scores
    assert (score.label, score.role, score.workload, score.records) == (
        "d/1",
        "champion",
        "live",
        3,
    )
    real = SpeculativeDecoder(loaded, drafter=build_drafter(spec, loaded), policy=FixedK(k))
    runs = [real.generate(p, max_new_tokens=20) for p in PROMPTS]  # the newest three
    drafted = sum(s.proposed for r in runs for s in r.steps)
    accepted = sum(s.accepted for r in runs for s in r.steps)
    assert drafted > 0
    assert score.acceptance_rate == pytest.approx(accepted / drafted)
    tokens = sum(len(r.token_ids) for r in runs)
    assert score.mean_accepted_length == pytest.approx(tokens / sum(len(r.steps) for r in runs))
    if spec == "layers:3":
        assert score.acceptance_rate > 0 and score.modelled_speedup > 0
    assert score.draft_cost == 0.0
    metrics = as_metrics(scores)
    assert metrics["d/1/live/acceptance_rate"] == score.acceptance_rate
    assert metrics["d/1/live/records"] == 3.0


def test_a_draft_never_evaluated_there_has_its_cost_profiled(tmp_path, loaded, records):
    package = write_package(
        tmp_path / "layer", DraftManifest(drafter="layers:1", k=3, policy="fixed")
    )
    scores, _ = shadow_scores(
        records, {"layers/2": ("challenger", package, {})}, target=loaded,
        settings=ShadowSettings(),
    )  # fmt: skip
    (score,) = scores
    assert score.records == len(records) and score.draft_cost > 0


def test_records_a_replay_cannot_reproduce_are_counted_not_replayed(records):
    sampled = records[0].model_copy(
        update={"sampling": Sampling(temperature=0.7, top_k=0, top_p=1.0, seed=1)}
    )
    redacted = records[1].model_copy(update={"prompt": "my key is [REDACTED:api_key]"})
    elsewhere = records[2].model_copy(update={"hardware": "cpu-int8"})
    kept, skipped = replayable(
        [sampled, redacted, elsewhere, *records[3:]], hardware=hardware_target("cpu")
    )
    assert kept == records[3:]
    assert skipped == {"sampled": 1, "redacted": 1}
