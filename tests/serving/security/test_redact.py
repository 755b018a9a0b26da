"""Redaction: secrets found in text, confined to the tokens that carry them, and a captured
record that still validates with its positions kept."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.hardware import hardware_target
from serving.records.schema import from_detailed, parse_record
from serving.security.redact import (
    RecordDropped,
    RedactionPatternError,
    Redactor,
    masked_tokens,
    redact_record,
    token_ends,
)
from serving.target import LoadedTarget

CPU_VLLM = hardware_target("cpu-vllm")

EMAIL = "alice.smith@example.com"
KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUv123456"


@pytest.fixture(scope="module")
def tokenizer(model_folder):
    return AutoTokenizer.from_pretrained(model_folder)


@pytest.fixture(scope="module")
def tiny(model_folder) -> LoadedTarget:
    """The tiny target with the real tokenizer, taken as it is (no end-of-sequence ids)."""
    return LoadedTarget.of(AutoModelForCausalLM.from_pretrained(model_folder).eval())


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
    sink = PartSink(tmp_path, PAIRS, hardware=CPU_VLLM, run_id="r", transform=redact)
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
    sink = PartSink(tmp_path / "b", PAIRS, hardware=CPU_VLLM, run_id="r", transform=dropping)
    sink.add({"timestamp": 1.0, "prompt_token_ids": prompt, "output_token_ids": output})
    assert sink.flush() == 0 and events[-1] == ("dropped:no_mask_token", 1)


def test_jwts_cards_private_keys_and_url_passwords_are_caught():
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcDEF123_-x"
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAK\n-----END RSA PRIVATE KEY-----"
    text = (
        f"auth {jwt} card 4111 1111 1111 1111 or 5500-0000-0000-0004 key\n{pem}\n"
        "db postgres://admin:s3cr3t-pw@db.example:5432/app and ghp_abcdefghijklmnopqrstuvwxyz12 "
        "and AKIAABCDEFGHIJKLMNOP"
    )
    redacted, counts = Redactor().redact_text(text)
    for secret in (jwt, "4111 1111", "5500-0000", "MIIEow", "s3cr3t", "ghp_", "AKIA"):
        assert secret not in redacted, secret
    assert "db postgres://[REDACTED:url_password]" in redacted  # "pw@db.example": e-mail-like too
    assert counts == {"jwt": 1, "card_number": 2, "private_key": 1, "url_password": 1, "api_key": 2}
    # Ordinary digit runs survive: Luhn fails, a network's first digit is missing, too long.
    plain = "order 1234 5678 1234 5678, id 9111111111111111, 41111111111111111111111, 3.14159"
    assert Redactor().redact_text(plain) == (plain, {})
    cut = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADAN"  # pasted without its END line
    assert Redactor().redact_text(cut)[0] == "[REDACTED:private_key]"


def _planted_record(tokenizer, index: int = 0) -> tuple[dict, dict[str, int]]:
    """A record of one rejected draft per step, with secrets planted in the prompt, the
    output, a rejected draft copying the prompt's key, a rejected draft completing a
    password and (all of them) the disagreements' contexts and the drafted rows; and how
    many disagreements each kind of position holds."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = f"Card 4111 1111 1111 1111, key {KEY}, order 1234 5678 1234 5678 #{index}."
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcDEF123"
    pieces = [" Sure, the token is ", jwt, " and the password=hunte", " is short. Done now."]
    output = [t for piece in pieces for t in encode(piece)]
    prompt_ids = encode(prompt)
    jwt_at = len(encode(pieces[0]))
    completes = jwt_at + len(encode(pieces[1])) + len(encode(pieces[2]))  # after "hunte"
    copies = len(output) - 2
    plain = encode(" the")[0]
    drafts = [plain if t != plain else encode(" a")[0] for t in output]
    drafts[completes] = encode("r")[0]  # "password=hunter": a secret the draft completes
    drafts[copies] = encode("proj")[0]  # a token of the prompt's key, copied by a lookup
    sequence = prompt_ids + output
    n_out = len(output)
    disagreements = [
        {
            "position": p, "draft_index": 0, "draft_token": drafts[p], "target_token": output[p],
            "target_prob_of_draft": 0.1, "target_prob_of_target": 0.6,
            "draft_prob_of_draft": 1.0, "draft_prob_of_target": 0.0,
            "context": sequence[: len(prompt_ids) + p][-32:],
        }
        for p in range(n_out)
    ]  # fmt: skip
    drafted = [
        {
            "stage": "pld", "stage_index": 0, "position": 0, "draft_confidence": None,
            "draft_entropy": None, "match_len": 1, "target_entropy": 1.0,
            "recent_logprob": -1.0, "length_ratio": 0.5, "step": p, "token": drafts[p],
            "accepted": False, "kept": False,
        }
        for p in range(n_out)
    ]  # fmt: skip
    row = {
        "schema_version": 3, "id": f"planted-{index}", "prompt_id": "live-x", "workload": "live",
        "split": "train", "prompt": prompt, "prompt_token_ids": prompt_ids,
        "output_text": "".join(pieces), "output_token_ids": output,
        "from_draft": [False] * n_out, "acceptance_rate": 0.0, "mean_accepted_length": 1.0,
        "draft_tokens": n_out, "accepted_tokens": 0, "checks": n_out,
        "steps": [[1, 0]] * n_out, "is_failure": True, "failure_threshold": 0.5,
        "drafter": "pld", "drafter_version": "builtin", "policy": "fixed", "hardware": "cpu",
        "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0},
        "timestamp": 1_750_000_000.0 + index, "run_id": "serve-test",
        "disagreements": disagreements, "drafted": drafted, "unverified": [],
        "masked_disagreements": 0,
    }  # fmt: skip
    jwt_tokens = len(encode(jwt))
    return row, {"output": jwt_tokens, "completes": 1, "copies": 1, "total": n_out}


def test_secrets_at_every_position_leave_a_record_the_suites_and_training_accept(tokenizer):
    from serving.records.schema import parse_record
    from tasks.data.dataset import build_dataset
    from tasks.data.validate import validate_records
    from tasks.train.distill_data import make_batch as distill_batch
    from tasks.train.head_data import make_batch as head_batch
    from tasks.train.teacher import TeacherSequence

    mask = tokenizer.unk_token_id
    rows = []
    for index in range(4):
        row, planted = _planted_record(tokenizer, index)
        redacted, counts = redact_record(row, Redactor(), tokenizer, mask)
        assert set(counts) >= {"card_number", "api_key", "jwt", "secret_assignment"}
        kept = redacted["disagreements"]
        removed = planted["output"] + planted["completes"] + planted["copies"]
        # The JWT's masked run may reach a token on either side; every other one stays.
        assert planted["total"] - removed - 2 <= len(kept) <= planted["total"] - removed
        assert redacted["masked_disagreements"] == planted["total"] - len(kept)
        assert all(mask not in (d["draft_token"], d["target_token"]) for d in kept)
        assert all(mask in d["context"] for d in kept), "the prompt's secrets are in each context"
        masked_rows = [d for d in redacted["drafted"] if d["token"] == mask]
        assert len(masked_rows) >= planted["completes"] + planted["copies"]
        text = tokenizer.decode(redacted["prompt_token_ids"] + redacted["output_token_ids"])
        for secret in ("4111 1111", "AbCdEf", "eyJhbGci"):
            assert secret not in text, secret
        assert "1234 5678 1234 5678" in text, "an ordinary digit run survives"
        stored = json.dumps(redacted)
        assert (
            "hunter" not in stored and f'"draft_token": {tokenizer.encode("proj")[0]}' not in stored
        )
        rows.append((f"row-{index}", redacted))
    result = validate_records(rows, known_hardware={"cpu"}, now=1_750_000_100.0)
    assert result.quarantined == [], result.quarantined
    mix = build_dataset(result.valid, heldout_share=0.25).train_mix
    assert mix, "a training mix is built from the redacted records"
    # Training leaves every position that reads or predicts the mask token out of the loss.
    record = parse_record(rows[0][1])
    tokens = torch.tensor(record.prompt_token_ids + record.output_token_ids)
    top_ids = torch.roll(tokens, -1).unsqueeze(1)  # a target that predicts the next token
    sequence = TeacherSequence(
        "p", tokens, torch.zeros(len(tokens), 4), top_ids, torch.zeros(len(tokens), 1),
        len(record.prompt_token_ids), mask_token_id=mask,
    )  # fmt: skip
    masked = (tokens == mask).tolist()
    for batch, reach in (
        (distill_batch([(sequence, 0)], 512), 1),
        (head_batch([(sequence, 0)], 512), 2),
    ):
        valid = batch.valid[0].tolist()
        assert 0 < sum(valid) < len(valid)
        for i, ok in enumerate(valid):
            touches = any(masked[i : i + reach + 1])
            assert ok == (not touches), (reach, i)
