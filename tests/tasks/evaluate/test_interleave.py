"""The one interleaved timing loop: the order of runs is exactly the order each caller wrote
by hand before (rotate: the evaluation, the bench, the studies; alternate: /compare), warm-up
comes first, per-round work happens between rounds, and each call is timed alone."""

from __future__ import annotations

import itertools

import pytest

from tasks.evaluate import interleave as module
from tasks.evaluate.interleave import Timed, interleave, round_order


def run_log(names, rounds, **options):
    """Every event in order, and the rounds as yielded."""
    events: list[tuple] = []
    calls = {name: (lambda index, name=name: events.append(("run", name, index)) or name)
             for name in names}  # fmt: skip
    yielded = []
    for timed in interleave(
        calls,
        rounds,
        warm_up=lambda name: events.append(("warm", name)),
        on_start=lambda name, index: events.append(("start", name, index)),
        on_end=lambda name, index: events.append(("end", name, index)),
        **options,
    ):
        events.append(("round", list(timed)))
        yielded.append(timed)
    return events, yielded


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_rotate_is_the_hand_written_rotation(n):
    names = [f"m{i}" for i in range(n)]
    for index in range(3 * n + 1):
        # The expression bench.py, evaluate.py, suffix_eval.py and cascade_sweep.py used.
        assert round_order(names, index) == names[index % n :] + names[: index % n]


def test_alternate_is_the_compare_order():
    names = ["plain", "pld", "ngram"]
    assert [round_order(names, r, "alternate") for r in range(3)] == [
        ["plain", "pld", "ngram"],
        ["ngram", "pld", "plain"],
        ["plain", "pld", "ngram"],
    ]


def test_warm_up_first_then_each_round_runs_every_method_once_and_yields():
    events, yielded = run_log(["a", "b", "c"], 3)
    assert events[:3] == [("warm", "a"), ("warm", "b"), ("warm", "c")]
    runs = [e for e in events if e[0] == "run"]
    assert [(name, index) for _, name, index in runs] == [
        ("a", 0), ("b", 0), ("c", 0),
        ("b", 1), ("c", 1), ("a", 1),
        ("c", 2), ("a", 2), ("b", 2),
    ]  # fmt: skip
    # Each round is yielded before the next one starts, keyed in the order it ran, and
    # on_start/on_end bracket every call.
    rounds = [i for i, e in enumerate(events) if e[0] == "round"]
    assert [events[i][1] for i in rounds] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert events[rounds[0] - 3 : rounds[0]] == [
        ("start", "c", 0),
        ("run", "c", 0),
        ("end", "c", 0),
    ]
    assert events[rounds[0] + 1] == ("start", "b", 1)
    assert [{name: t.value for name, t in r.items()} for r in yielded] == [
        {"a": "a", "b": "b", "c": "c"}
    ] * 3


def test_alternate_rounds_run_reversed_every_other_round():
    events, _ = run_log(["x", "y"], 4, order="alternate")
    runs = [name for kind, name, *_ in events if kind == "run"]
    assert runs == ["x", "y", "y", "x", "x", "y", "y", "x"]


def test_each_call_is_timed_alone(monkeypatch):
    """The clock is read right before and right after the call: warm-up and the hooks are
    not timed."""
    ticks = itertools.count()
    monkeypatch.setattr(module.time, "perf_counter", lambda: float(next(ticks)))
    spend = {"slow": 3, "fast": 1}

    def call(name):
        def run(_index):
            for _ in range(spend[name] - 1):  # each read of the clock costs one tick
                module.time.perf_counter()
            return name

        return run

    (timed,) = interleave({n: call(n) for n in spend}, 1, warm_up=lambda n: None)
    assert timed == {"slow": Timed("slow", 3.0), "fast": Timed("fast", 1.0)}


class Stopped(Exception):
    pass


def test_an_error_in_a_run_stops_the_loop():
    ran = []

    def boom(index):
        if index == 1:
            raise Stopped  # as /compare's Interrupted does
        return index

    calls = {"ok": lambda index: ran.append(index), "boom": boom}
    rounds = interleave(calls, 3)
    next(rounds)
    with pytest.raises(Stopped):
        next(rounds)
    assert ran == [0]  # round 1 runs "boom" first, and nothing after it


@pytest.mark.parametrize(
    "calls, rounds, order, message",
    [
        ({"a": int}, -1, "rotate", "rounds must be an integer >= 0, got -1"),
        ({"a": int}, True, "rotate", "rounds must be an integer >= 0, got True"),
        ({"a": int}, 2, "shuffle", "unknown order 'shuffle'"),
        ({}, 2, "rotate", "give at least one method"),
    ],
)
def test_bad_arguments_fail_at_the_call_naming_the_value(calls, rounds, order, message):
    with pytest.raises(ValueError, match=message):
        interleave(calls, rounds, order=order)  # not iterated: checked before any run


def test_zero_rounds_run_nothing_but_the_warm_up():
    events, yielded = run_log(["a"], 0)
    assert events == [("warm", "a")] and yielded == []
