"""A user's own traffic: a JSONL file of OpenAI chat-completion requests as live prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.errors import BadInputError
from serving.hardware import hardware_target
from serving.records.schema import LIVE_WORKLOAD
from serving.records.store import read_raw
from tasks.data.chat_requests import MAX_REPORTED, read_chat_requests
from tasks.data.collect import collect
from tasks.data.curate import curate

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "Another?"},
]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def _line(**request) -> str:
    return json.dumps(request)


def test_a_good_file_gives_live_train_prompts_in_file_order(tmp_path):
    path = _write(
        tmp_path,
        [
            _line(messages=CONVERSATION, model="gpt-4o", max_tokens=64, temperature=0.7, id="a"),
            "",
            "   ",
            # Extra OpenAI fields, on the request and on a message, are ignored.
            _line(
                messages=[{"role": "user", "content": "Hi", "name": "bob"}],
                stream=True,
                top_p=0.9,
                temperature=1,
            ),
        ],
    )
    first, second = read_chat_requests(path)
    assert (first.id, first.workload, first.split, first.reference) == (
        "a",
        LIVE_WORKLOAD,
        "train",
        None,
    )
    assert first.messages == CONVERSATION  # system prompt and earlier turns kept
    assert first.user_text == "Name a prime.\n\nAnother?"
    assert second.messages == [{"role": "user", "content": "Hi"}]
    assert second.workload == "live" and second.split == "train"
    assert len(second.id) == 32  # no id given: a hash of the request


def test_ids_without_an_id_field_are_stable_and_repeats_stay_distinct(tmp_path):
    line = _line(messages=[{"role": "user", "content": "same question"}])
    reordered = json.dumps({"messages": [{"content": "same question", "role": "user"}]})
    path = _write(tmp_path, [line, reordered, _line(messages=CONVERSATION)])
    prompts = read_chat_requests(path)
    ids = [p.id for p in prompts]
    assert len(set(ids)) == 3  # the same request twice is two prompts, not a duplicate
    assert ids == [p.id for p in read_chat_requests(path)]  # the same in every run
    # A request's id depends on its content and repeats before it, not on its line.
    moved = _write(tmp_path, [_line(messages=CONVERSATION), line])
    assert [p.id for p in read_chat_requests(moved)] == [ids[2], ids[0]]


@pytest.mark.parametrize(
    "line, problem",
    [
        ('{"messages": [', "not JSON"),
        ("[1, 2]", "not a JSON object (got list)"),
        ('"hello"', "not a JSON object (got str)"),
        ('{"model": "gpt-4o"}', "messages: Field required"),
        ('{"messages": []}', "messages: List should have at least 1 item"),
        ('{"messages": "hi"}', "messages: Input should be a valid list"),
        (
            _line(messages=[{"role": "tool", "content": "x"}]),
            "messages.0.role: Input should be 'system', 'user' or 'assistant' (got 'tool')",
        ),
        (_line(messages=[{"role": "user"}]), "messages.0.content: Field required"),
        (
            _line(messages=[{"role": "user", "content": 3}]),
            "messages.0.content: Input should be a valid string (got 3)",
        ),
        (
            _line(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}]),
            "messages.0.content: Input should be a valid string",
        ),
        (
            _line(messages=CONVERSATION[:3]),
            "the last message has role 'assistant'; the conversation must end with the user's turn",
        ),
        (_line(messages=[{"role": "user", "content": "  "}]), "the last (user) message is empty"),
        (
            _line(messages=CONVERSATION, max_tokens="many"),
            "max_tokens: Input should be a valid integer (got 'many')",
        ),
        (_line(messages=CONVERSATION, temperature=-1), "temperature: Input should be greater"),
        (_line(messages=CONVERSATION, id=""), "id: String should have at least 1 character"),
    ],
)
def test_a_bad_line_is_named_with_its_number_and_problem(tmp_path, line, problem):
    good = _line(messages=CONVERSATION)
    path = _write(tmp_path, [good, "", line, good])
    with pytest.raises(BadInputError) as caught:
        read_chat_requests(path)
    message = str(caught.value)
    assert f"1 bad line(s) in chat requests file {str(path)!r}" in message
    assert f"{path}:3: {problem}" in message


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(_line(messages=CONVERSATION).encode() + b"\n\xff\xfe\n")
    with pytest.raises(BadInputError, match=f"{path}:2: not UTF-8 text"):
        read_chat_requests(path)


def test_a_duplicate_id_names_both_lines(tmp_path):
    path = _write(tmp_path, [_line(messages=CONVERSATION, id=f"r{i % 2}") for i in range(3)])
    with pytest.raises(BadInputError, match=rf"{path}:3: duplicate id 'r0' \(first on line 1\)"):
        read_chat_requests(path)


def test_every_bad_line_is_counted_and_the_first_ones_listed(tmp_path):
    bad = 3 * MAX_REPORTED
    path = _write(tmp_path, [_line(messages=CONVERSATION)] + ["not json"] * bad)
    with pytest.raises(BadInputError) as caught:
        read_chat_requests(path)
    message = str(caught.value)
    assert message.startswith(f"{bad} bad line(s)")
    listed = [line for line in message.splitlines() if line.startswith(f"{path}:")]
    assert [line.split(":")[1] for line in listed] == [str(n) for n in range(2, 2 + MAX_REPORTED)]
    assert message.endswith(f"... and {bad - MAX_REPORTED} more")


def test_a_missing_file_is_a_bad_input(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(BadInputError, match=f"cannot read chat requests file {str(missing)!r}"):
        read_chat_requests(missing)
    with pytest.raises(BadInputError, match="cannot read chat requests file"):
        read_chat_requests(tmp_path)  # a folder


def test_an_empty_file_has_no_requests(tmp_path):
    assert read_chat_requests(_write(tmp_path, ["", "  "])) == []


def test_collected_file_traffic_is_valid_live_train_data_held_out_by_time(
    tmp_path, pld_decoder, char_tokenizer
):
    """The whole conversation is decoded, the record stores the user's turns as its prompt,
    and curation holds out the newest of it."""
    path = _write(
        tmp_path,
        [_line(messages=CONVERSATION)]
        + [_line(messages=[{"role": "user", "content": f"abc abc {i}"}]) for i in range(4)],
    )
    prompts = read_chat_requests(path)
    collect(
        prompts,
        decoder=pld_decoder,
        tokenizer=char_tokenizer,
        store_root=tmp_path / "store",
        run_id="file",
        hardware=hardware_target("cpu"),
        max_new_tokens=8,
        progress=False,
    )
    rows = [row for _, row in read_raw(tmp_path / "store")]
    first = rows[0]
    assert (first["workload"], first["split"], first["prompt_id"]) == (
        "live",
        "train",
        prompts[0].id,
    )
    assert first["prompt"] == "Name a prime.\n\nAnother?"  # the user's turns
    # No chat template: the conversation's turns joined, system prompt and reply included.
    joined = "\n\n".join(m["content"] for m in CONVERSATION)
    assert first["prompt_token_ids"] == char_tokenizer(joined)["input_ids"]

    summary = curate(tmp_path / "store", tmp_path / "dataset")
    assert summary.validation.valid == 5
    assert summary.dataset["heldout_traffic"] == 1  # ceil(0.2 * 5), the newest
    held = [json.loads(line) for line in (tmp_path / "dataset" / "heldout_traffic.jsonl").open()]
    assert held[0]["timestamp"] == max(r["timestamp"] for r in rows)
