"""``specops chat`` driven in a real pseudo-terminal, as a person would: type prompts,
switch drafters, /compare, /stats, bad input, /save, Ctrl-C, a failing /train, and read
the screen (tests/specops/terminal.py). The target is the tiny random Llama with the real
tokenizer (as the ``model_folder`` fixture's, with a longer context)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from serving.models.real import cache_root
from serving.paths import PROJECT_ROOT
from serving.records.schema import parse_record
from serving.records.store import part_files
from tests.specops.terminal import Terminal

PROMPT = r"›"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """The ``model_folder`` model with a context long enough for an answer that is still
    running when the test presses Ctrl-C (4,000 tokens: seconds even on a quiet machine)."""
    from transformers import AutoTokenizer

    from serving.models.real import real_model_dir
    from serving.models.tiny import tiny_llama

    folder = tmp_path_factory.mktemp("chat") / "target"
    tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2, max_positions=4096).save_pretrained(
        folder
    )
    AutoTokenizer.from_pretrained(real_model_dir()).save_pretrained(folder)
    return folder


def chat(tmp_path: Path, chat_model: Path, *args: str) -> Terminal:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    (tmp_path / "home").mkdir()
    env.update(
        HOME=str(tmp_path / "home"),  # Prefect's home and the caches too
        # ... but the lean step's C++ ops come from the machine's cache, where the test
        # command builds them first (a compile in here would eat the terminal's timeout).
        SPECOPS_CACHE=str(cache_root()),
        TERM="xterm-256color",
        SPECOPS_MLFLOW_URI=f"sqlite:///{tmp_path}/mlflow.db",
        SPECOPS_MLFLOW_ARTIFACTS=str(tmp_path / "artifacts"),
    )
    argv = [
        sys.executable, "-m", "specops", "chat", "--target", str(chat_model),
        "--threads", "1", "--history", str(tmp_path / "history"),
        "--work", str(tmp_path / "work"), *args,
    ]  # fmt: skip
    return Terminal(argv, env=env, cwd=str(PROJECT_ROOT))


@pytest.mark.slow  # a chat process in a terminal, a model and a /train job: minutes
def test_a_session_in_a_terminal(tmp_path, chat_model):
    # The session's store holds nothing a draft can be trained on (see /train below).
    store = tmp_path / "store"
    bad = store / "records" / "hardware=cpu" / "date=2026-01-01" / "part-x-00000.jsonl"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"not": "a record"}\n')
    term = chat(tmp_path, chat_model, "--max-tokens", "24", "--store", str(store))
    try:
        at = term.wait_for(r"specops chat · target .* on cpu · draft pld \(cost, k=10\)")
        at = term.wait_for(r"pld ›", after=at)

        # A prompt: the answer streams, then one status line.
        term.type("Say hello")
        at = term.wait_for(r"24 tokens in \d+ passes · [\d.]+ tok/s · acceptance .* pld", after=at)

        # The target drafting for itself: every draft is accepted, and shown in bold green.
        term.type("/policy fixed")
        at = term.wait_for(r"policy: pld \(fixed, k=10\)", after=at)
        term.type(f"/drafter model:{chat_model}")
        at = term.wait_for(r"drafter: model:.* \(fixed, k=10\)", after=at)
        term.type("Say hello")
        at = term.wait_for(r"acceptance 1\.00 · mean accepted length [\d.]+ · model:", after=at)
        answer_row = term.rows_with("acceptance 1.00")[-1] - 1
        drafted = [c for c in term.chars(answer_row) if c.data.strip() and c.fg == "green"]
        assert drafted and all(c.bold for c in drafted), term.text

        term.type("/drafter ngram:4")
        at = term.wait_for(r"drafter: ngram:4 \(fixed, k=10\)", after=at)
        term.type("Write a list of fruits")
        at = term.wait_for(r"24 tokens in \d+ passes .* ngram:4", after=at)

        # /compare: plain decoding and two drafters, greedy, so every output matches plain.
        term.type("/compare pld ngram:4")
        at = term.wait_for(r"greedy, 2 interleaved rounds; prompt: Write a list", after=at)
        table = term.text[:at]
        rows = {
            name: re.search(rf"│ {re.escape(name)}\s+│\s+24 │.*│ (\w+)\s+│", table)
            for name in ("plain", "pld", "ngram:4")
        }
        assert all(rows.values()), table
        assert {name: row[1] for name, row in rows.items() if row} == dict.fromkeys(rows, "yes")

        # /stats: the three answers pooled, and acceptance by draft position.
        term.type("/stats")
        at = term.wait_for(r"this session's 3 answers, pooled", after=at)
        at = term.wait_for(r"│ tokens\s+│\s+72 │", after=at)
        at = term.wait_for(r"draft position ┃ drafted ┃ accepted ┃ rate", after=at)
        at = term.wait_for(r"│\s+1 │\s+\d+ │\s+\d+ │", after=at)

        # Bad input: one line each, and the session goes on.
        term.type("/bogus")
        at = term.wait_for(r"unknown command /bogus; commands: /drafter /k .* \(/help\)", after=at)
        term.type("/k 0")
        at = term.wait_for(r"k must be between 1 and 64, got 0", after=at)
        term.type("/temperature -1")
        at = term.wait_for(r"temperature must be a finite number >= 0 \(0 = greedy\)", after=at)
        term.type("/drafter bogus")
        at = term.wait_for(r"unknown drafter 'bogus'; kinds: none, pld, ngram", after=at)

        # /save: the three answers' records, one new part of a store.
        saved = tmp_path / "saved"
        term.type(f"/save {saved}")
        at = term.wait_for(r"saved 3 record\(s\) to", after=at)
        (part,) = part_files(saved)
        records = [parse_record(json.loads(line)) for line in part.read_text().splitlines()]
        assert [r.workload for r in records] == ["live"] * 3
        assert {r.prompt for r in records} == {"Say hello", "Write a list of fruits"}

        # Ctrl-C stops an answer, not the session.
        term.type("/max-tokens 4000")
        at = term.wait_for(r"max tokens: 4000", after=at)
        term.type("Count from one to one hundred")
        at = term.wait_for(r"Count from one to one hundred\n\s*\S", after=at)
        term.child.sendintr()
        at = term.wait_for(r"\d+ tokens in \d+ passes .* · interrupted", after=at)
        at = term.wait_for(PROMPT, after=at)

        # Ctrl-C at the prompt clears the line (else "/train" below would extend a prompt).
        term.child.send("half a prompt")
        term.wait_for("half a prompt", after=at)
        term.child.sendintr()

        # A failing flow: nothing in the session's store can be trained on (and nothing is
        # left to save: the interrupted answer keeps no record). One line says why.
        term.type("/train")
        at = term.wait_for(r"running: specops loop run retrain", after=at)
        # The flow starts and stops a temporary Prefect server: ~1 min alone, more on a busy
        # core (CI's last run was still stopping it at 0:55).
        at = term.wait_for(
            r"/train failed after \d+:\d\d: no token sequences", after=at, timeout_s=240
        )
        term.type("/k 3")
        at = term.wait_for(r"k: ngram:4 \(fixed, k=3\)", after=at)
        assert "Traceback" not in term.text

        term.type("/quit")
        assert term.wait_exit() == 0
    finally:
        term.close()


@pytest.mark.parametrize("option", [["--k", "0"], ["--drafter", "bogus"], ["--mode", "x"]])
def test_bad_options_fail_before_the_model_loads(option):
    from typer.testing import CliRunner

    from specops.cli import app

    result = CliRunner().invoke(app, ["chat", *option])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
