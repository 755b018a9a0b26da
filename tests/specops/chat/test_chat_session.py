"""The session on a loaded target, without a terminal: answers with provenance, /compare,
/stats, Ctrl-C (as ``cancelled``), /save with redaction, and failures that change
nothing. The target is the tiny random Llama with the real tokenizer."""

from __future__ import annotations

import json

import pytest

from serving.engine.metrics import position_counts
from serving.errors import SpecOpsError
from serving.records.schema import parse_record
from serving.records.store import part_files
from specops.chat.commands import Settings
from specops.chat.session import PLAIN, ChatSession, Interrupted


@pytest.fixture(scope="module")
def loaded(model_folder):
    """The tiny target loaded as ``specops chat`` loads it (hardware target ``cpu``)."""
    from serving.loader import load_target

    return load_target(str(model_folder))


@pytest.fixture
def session(loaded):
    return ChatSession(loaded, settings=Settings(max_tokens=16, policy="fixed", k=4))


def test_an_answer_streams_its_text_with_provenance(session, model_folder):
    session.set("drafter", f"model:{model_folder}")  # the target drafting for itself
    pieces: list[tuple[str, bool]] = []
    turn = session.ask("Say hello", on_text=lambda text, drafted: pieces.append((text, drafted)))
    assert "".join(text for text, _ in pieces) == turn.text
    expected = session.tokenizer.decode(turn.result.token_ids, skip_special_tokens=True)
    assert turn.text == expected
    assert turn.result.stats.acceptance_rate == 1.0
    assert any(drafted for _, drafted in pieces)
    assert turn.draft == f"model:{model_folder} (fixed, k=4)"
    assert turn.result.record is not None  # detailed mode by default


def test_compare_runs_plain_and_each_drafter_and_greedy_outputs_match(session):
    session.ask("Write a list of fruits")
    seen: list[tuple[str, int]] = []
    rows = session.compare(["pld", "ngram:4"], on_run=lambda name, r: seen.append((name, r)))
    assert [row.name for row in rows] == [PLAIN, "pld", "ngram:4"]
    assert all(row.matches_plain for row in rows)
    assert rows[0].speedup == pytest.approx(1.0)
    assert rows[0].acceptance_rate is None  # plain decoding drafts nothing
    # Interleaved: the second round runs in the opposite order.
    assert seen == [(PLAIN, 0), ("pld", 0), ("ngram:4", 0), ("ngram:4", 1), ("pld", 1), (PLAIN, 1)]
    assert len(session.turns) == 1  # comparisons are not answers


def test_compare_needs_a_prompt_and_can_be_interrupted(session):
    with pytest.raises(SpecOpsError, match="nothing to compare yet"):
        session.compare(["pld"])
    with pytest.raises(Interrupted):
        session.compare(["pld"], "Say hello", cancelled=lambda: True)


def test_stats_pool_the_answers(session):
    turns = [session.ask("Say hello"), session.ask("Write a list of fruits")]
    stats = session.stats()
    assert stats.pooled["requests"] == 2
    assert stats.pooled["generated_tokens"] == sum(len(t.result.token_ids) for t in turns)
    assert stats.pooled["checks"] == sum(t.result.stats.checks for t in turns)
    reached = [position_counts(t.result.steps)[0] for t in turns]
    assert sum(stats.reached) == sum(sum(r) for r in reached)
    assert all(0.0 <= rate <= 1.0 for rate in stats.acceptance_by_position if rate is not None)


def test_a_cancelled_answer_stops_and_keeps_no_record(session):
    tokens = []
    turn = session.ask(
        "Count to a hundred", on_text=lambda text, _: tokens.append(text), cancelled=lambda: True
    )
    assert turn.result.stop_reason == "cancelled"
    assert len(turn.result.token_ids) < 16
    assert session.unsaved == []
    assert session.stats().pooled["requests"] == 1  # it still ran


def test_a_draft_that_fails_to_build_changes_nothing(session):
    decoder = session.decoder
    with pytest.raises(SpecOpsError, match="layers:N needs"):
        session.set("drafter", "layers:5")  # the tiny target has 2 layers
    assert session.decoder is decoder
    assert session.settings.drafter == "pld"


def test_save_appends_redacted_records_as_one_part(session, tmp_path):
    session.ask("My key is sk-abcdefghijklmnopqrstuvwx, now say hello")
    session.set("mode", "fast")
    session.ask("Say hello")  # fast mode: no record
    report = session.save(tmp_path / "store")
    assert report.saved == 1 and len(report.parts) == 1
    (part,) = part_files(tmp_path / "store")
    (row,) = [json.loads(line) for line in part.read_text().splitlines()]
    record = parse_record(row)
    assert record.workload == "live" and record.split == "train"
    assert "sk-abcdef" not in record.prompt and "[REDACTED:api_key]" in record.prompt
    assert record.drafter_version == "chat:pld (fixed, k=4)"
    # Saved once: the next /save has nothing new.
    assert session.save(tmp_path / "store").parts == []


def test_champion_drafts_with_the_registry_champion_or_says_there_is_none(
    session, tmp_path, monkeypatch, mlflow_uri
):
    from registry.client import Registry
    from serving.engine.drafters.package import DraftManifest, write_package

    monkeypatch.setenv("SPECOPS_MLFLOW_URI", mlflow_uri)
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", str(tmp_path / "artifacts"))
    decoder = session.decoder
    with pytest.raises(SpecOpsError, match="has no champion for hardware target 'cpu'"):
        session.use_champion(None, tmp_path / "cache")
    assert session.decoder is decoder

    registry = Registry()
    package = write_package(tmp_path / "ngram", DraftManifest(drafter="ngram:3", k=5))
    draft = registry.log_draft(package, family="ngram")
    registry.log_evaluation(draft, "cpu", {"mean_accepted_length": 1.0})
    registry.promote(registry.get("ngram", draft.version), "cpu", reason="test")
    label = session.use_champion(None, tmp_path / "cache")
    assert label == f"{draft.label}, champion of cpu: ngram:3 (cost, k=5)"
    assert (session.settings.drafter, session.settings.policy, session.settings.k) == (
        "ngram:3",
        "cost",
        5,
    )
    assert session.ask("Say hello").draft == label
