"""Redaction: secrets found in text, confined to the tokens that carry them, and a captured
record that still validates with its positions kept."""

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from serving.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine import SpeculativeDecoder
from serving.policy import FixedK
from serving.records.schema import from_detailed, parse_record
from serving.security.redact import (
    RecordDropped,
    RedactionPatternError,
    Redactor,
    masked_tokens,
    redact_record,
    token_ends,
)

EMAIL = "alice.smith@example.com"
KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUv123456"


@pytest.fixture(scope="module")
def tokenizer(model_folder):
    return AutoTokenizer.from_pretrained(model_folder)


@pytest.fixture(scope="module")
def tiny(model_folder):
    return AutoModelForCausalLM.from_pretrained(model_folder).eval()


def test_builtin_patterns_find_emails_and_keys():
    text = f"write to {EMAIL}; key {KEY}, AKIAABCDEFGHIJKLMNOP, password=hunter22 ok"
    redacted, counts = Redactor().redact_text(text)
    assert EMAIL not in redacted and KEY not in redacted and "hunter22" not in redacted
    assert "AKIA" not in redacted
    assert counts == {"email": 1, "api_key": 2, "secret_assignment": 1}
    assert redacted.startswith("write to [REDACTED:email]; key [REDACTED:api_key]")
    assert Redactor().redact_text("nothing to see here, 1 + 1 = 2") == (
        "nothing to see here, 1 + 1 = 2",
        {},
    )


def test_configured_patterns_are_applied_and_bad_ones_named():
    redactor = Redactor([r"\b\d{3}-\d{2}-\d{4}\b"])
    assert redactor.redact_text("ssn 123-45-6789")[0] == "ssn [REDACTED:pattern_1]"
    with pytest.raises(RedactionPatternError, match=r"'\(unclosed' \(pattern_1\) does not"):
        Redactor(["(unclosed"])
    with pytest.raises(RedactionPatternError, match="matches the empty string"):
        Redactor(["x*"])


def test_token_ends_match_the_decoded_text(tokenizer):
    text = f"mail {EMAIL} ünïcode 日本語 and {KEY}"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ends = token_ends(tokenizer, ids)
    assert ends[-1] == len(tokenizer.decode(ids)) and ends == sorted(ends)
    for end, i in zip(ends, range(len(ids)), strict=True):  # every prefix agrees
        prefix = tokenizer.decode(ids[: i + 1]).rstrip("\ufffd")
        assert end == len(prefix)
    spans = Redactor().spans(tokenizer.decode(ids))
    masked = masked_tokens(ends, spans)
    kept = tokenizer.decode([t for i, t in enumerate(ids) if i not in masked])
    assert "alice" not in kept and "AbCd" not in kept and "日本語" in kept


def captured_row(tiny, tokenizer, text):
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoder = SpeculativeDecoder(tiny, drafter=PromptLookupDrafter(), policy=FixedK(3))
    record = decoder.generate(prompt, max_new_tokens=16, mode="detailed").record
    output = tokenizer.decode(record.output_token_ids, skip_special_tokens=True)
    return from_detailed(
        record,
        record_key="r1",
        prompt_id="p",
        workload="live",
        split="train",
        prompt=text,
        output_text=output,
        drafter_version="builtin",
        hardware="cpu",
        run_id="serve-test",
    )


def test_a_record_is_redacted_with_its_positions_kept(tiny, tokenizer):
    text = f"My address is {EMAIL} and my key is {KEY}. My address is {EMAIL}."
    row = captured_row(tiny, tokenizer, text)
    redacted, counts = redact_record(row, Redactor(), tokenizer, tokenizer.unk_token_id)
    assert counts == {"email": 2, "api_key": 1}
    parse_record(redacted)  # still a valid record
    for field in ("prompt_token_ids", "output_token_ids", "from_draft", "steps", "drafted"):
        assert len(redacted[field]) == len(row[field]), field
    assert redacted["prompt"].count("[REDACTED:email]") == 2
    decoded = tokenizer.decode(redacted["prompt_token_ids"], skip_special_tokens=True)
    assert "alice" not in decoded and "AbCdEf" not in decoded and "My address is" in decoded
    assert redacted["prompt_id"] != row["prompt_id"]
    assert row["prompt"] == text, "the input row is not modified"
    sequence = redacted["prompt_token_ids"] + redacted["output_token_ids"]
    for item in redacted["disagreements"]:
        where = len(redacted["prompt_token_ids"]) + item["position"]
        assert item["context"] == sequence[where - len(item["context"]) : where]


def test_a_record_without_secrets_is_unchanged(tiny, tokenizer):
    row = captured_row(tiny, tokenizer, "the cat sat on the mat; the cat sat on the")
    assert redact_record(row, Redactor(), tokenizer, tokenizer.unk_token_id) == (row, {})


def test_a_record_is_dropped_when_there_is_no_mask_token(tiny, tokenizer):
    row = captured_row(tiny, tokenizer, f"mail {EMAIL} now")
    with pytest.raises(RecordDropped, match="no unknown or padding token") as error:
        redact_record(row, Redactor(), tokenizer, None)
    assert error.value.kind == "no_mask_token"


def test_captured_pairs_are_redacted_or_dropped_through_the_sink(tmp_path, tokenizer):
    from serving.gateway.sink import PAIRS, PartSink
    from serving.records import store
    from serving.security.redact import pair_redactor

    events: list[tuple[str, int]] = []
    redact = pair_redactor(
        Redactor(), tokenizer, tokenizer.unk_token_id, on_event=lambda k, n: events.append((k, n))
    )
    prompt = tokenizer(f"mail {EMAIL} please", add_special_tokens=False)["input_ids"]
    output = tokenizer(f"sure, {KEY}", add_special_tokens=False)["input_ids"]
    plain = tokenizer("nothing here", add_special_tokens=False)["input_ids"]
    sink = PartSink(tmp_path, PAIRS, hardware="cpu-vllm", run_id="r", transform=redact)
    sink.add({"timestamp": 1.0, "prompt_token_ids": prompt, "output_token_ids": output})
    sink.add({"timestamp": 1.0, "prompt_token_ids": plain, "output_token_ids": plain})
    assert sink.flush() == 2
    rows = [row for _, row in store.read_raw(tmp_path, PAIRS)]
    first, second = rows
    assert len(first["prompt_token_ids"]) == len(prompt)
    assert len(first["output_token_ids"]) == len(output)
    text = tokenizer.decode(first["prompt_token_ids"] + first["output_token_ids"])
    assert "alice" not in text and "AbCd" not in text and "please" in text
    assert second["prompt_token_ids"] == plain
    assert sorted(events) == [("api_key", 1), ("email", 1)]
    dropping = pair_redactor(
        Redactor(), tokenizer, None, on_event=lambda k, n: events.append((k, n))
    )
    sink = PartSink(tmp_path / "b", PAIRS, hardware="cpu-vllm", run_id="r", transform=dropping)
    sink.add({"timestamp": 1.0, "prompt_token_ids": prompt, "output_token_ids": output})
    assert sink.flush() == 0 and events[-1] == ("dropped:no_mask_token", 1)
