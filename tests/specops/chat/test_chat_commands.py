"""What a typed line means: prompts, commands, and one-line errors for bad input."""

from __future__ import annotations

import pytest

from serving.errors import BadInputError
from specops.chat.commands import (
    Action,
    Compare,
    Eval,
    Prompt,
    Save,
    Set,
    Settings,
    ShowChampion,
    parse_line,
)


@pytest.mark.parametrize(
    ("line", "meaning"),
    [
        ("  ", None),
        ("Write a haiku", Prompt("Write a haiku")),
        ("//etc/hosts is a file", Prompt("/etc/hosts is a file")),
        ("/drafter ngram:4", Set("drafter", "ngram:4")),
        ("/drafter ngram:4, fallback=target", Set("drafter", "ngram:4, fallback=target")),
        ("/DRAFTER none", Set("drafter", "none")),
        ("/k 6", Set("k", 6)),
        ("/policy Fixed", Set("policy", "fixed")),
        ("/temperature 0.7", Set("temperature", 0.7)),
        ("/max-tokens 64", Set("max_tokens", 64)),
        ("/mode fast", Set("mode", "fast")),
        ("/compare", Compare((), None)),
        ("/compare pld ngram:4 pld none", Compare(("pld", "ngram:4"), None)),
        ("/compare pld -- Say it twice", Compare(("pld",), "Say it twice")),
        ("/champion", ShowChampion(None)),
        ("/champion cpu-stock", ShowChampion("cpu-stock")),
        ("/save", Save(None)),
        ("/save /tmp/store", Save("/tmp/store")),
        ("/eval", Eval(())),
        ("/eval head/3 suffix/2", Eval(("head/3", "suffix/2"))),
        ("/stats", Action("stats")),
        ("/train", Action("train")),
        ("/help", Action("help")),
        ("/quit", Action("quit")),
        ("/exit", Action("quit")),
    ],
)
def test_a_line_means(line, meaning):
    assert parse_line(line) == meaning


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("/bogus", "unknown command /bogus; commands: /drafter /k /policy"),
        ("/k 0", "k must be between 1 and 64, got 0"),
        ("/k x", "/k: 'x' is not an integer (/k N)"),
        ("/k", "/k takes a value: /k N"),
        ("/k 1 2", "/k takes one value: /k N"),
        ("/temperature -1", "temperature must be a finite number >= 0 (0 = greedy), got -1.0"),
        ("/temperature nan", "temperature must be a finite number >= 0"),
        ("/temperature hot", "/temperature: 'hot' is not a number"),
        ("/policy magic", "unknown policy 'magic'; choose one of fixed, adaptive, cost"),
        ("/mode verbose", "unknown mode 'verbose'; choose one of fast, detailed"),
        ("/max-tokens 0", "max tokens must be an integer >= 1, got 0"),
        ("/drafter", "/drafter takes a spec"),
        ("/drafter bogus", "unknown drafter 'bogus'; kinds: none, pld, ngram"),
        ("/drafter pld:0", "the number must be >= 1, got 0"),
        ("/drafter model:/no/such/folder", "is not a model folder"),
        ("/compare pld bogus", "unknown drafter 'bogus'"),
        ("/compare pld --  ", "the prompt after -- is empty"),
        ("/champion tpu", "unknown hardware target 'tpu'"),
        ("/stats now", "/stats takes no argument, got 'now'"),
        ("/save a b", "/save takes at most one store folder"),
    ],
)
def test_bad_input_is_one_line_naming_it(line, message):
    with pytest.raises(BadInputError) as caught:
        parse_line(line)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_settings_are_checked_and_changed_one_value_at_a_time():
    settings = Settings().check()
    assert settings.with_value("k", 4).k == 4
    assert settings.k == 10  # frozen: a new object
    with pytest.raises(BadInputError, match="unknown mode 'x'"):
        Settings(mode="x").check()
    with pytest.raises(BadInputError, match="unknown setting 'colour'"):
        settings.with_value("colour", "red")
