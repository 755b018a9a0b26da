"""One interleaved timing loop for every comparison of decoding methods.

Methods run in rounds (one round per prompt, or per repeat of one prompt); each round runs
every method once, in an order that changes from round to round, so that load drift on the
machine, warm caches and whoever-runs-first effects land on all methods alike:

- ``rotate``: round ``r`` starts at method ``r mod n`` and wraps around (round 0 runs them
  as given): the evaluation, the benchmark and the studies;
- ``alternate``: as given in even rounds, reversed in odd ones (``specops chat``'s
  ``/compare``, whose few rounds repeat one prompt).

Each method may be warmed up once first (untimed, in the given order), so first-call costs
(kernels, allocations) stay out of every timing. Rounds are yielded as soon as they have run:
work a caller does per round (checking outputs, executing code) happens between rounds, as
it did when each caller wrote the loop itself.

Here rather than in ``tasks/bench``: the evaluation stage uses it, and ``bench``, the
product's commands and ``benchmarks/`` all import from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, get_args

T = TypeVar("T")
Order = Literal["rotate", "alternate"]
ORDERS: tuple[str, ...] = get_args(Order)


@dataclass(frozen=True)
class Timed(Generic[T]):
    """What one call returned, and how long it took (wall clock, ``time.perf_counter``)."""

    value: T
    seconds: float


def round_order(names: Sequence[str], round_index: int, order: Order = "rotate") -> list[str]:
    """The order in which round ``round_index`` runs ``names``."""
    names = list(names)
    if order == "rotate":
        shift = round_index % len(names) if names else 0
        return names[shift:] + names[:shift]
    if order == "alternate":
        return names if round_index % 2 == 0 else names[::-1]
    raise ValueError(f"unknown order {order!r}; choose one of {ORDERS}")


def interleave(
    calls: Mapping[str, Callable[[int], T]],
    rounds: int,
    *,
    order: Order = "rotate",
    warm_up: Callable[[str], object] | None = None,
    on_start: Callable[[str, int], None] | None = None,
    on_end: Callable[[str, int], None] | None = None,
    first_round: int = 0,
) -> Iterator[dict[str, Timed[T]]]:
    """Run ``calls[name](round_index)`` for every name in each of ``rounds`` rounds, in
    :func:`round_order`; yield each round's results keyed by name, in the order they ran.
    Round indices start at ``first_round`` (a run that goes on where another stopped).

    ``warm_up(name)`` runs once per name, in the given order, before the first round.
    ``on_start(name, round_index)`` and ``on_end(name, round_index)`` are called around each
    timed call (progress bars, a "running ..." line); they are not timed.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be an integer >= 0, got {rounds!r}")
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose one of {ORDERS}")
    if not calls:
        raise ValueError("nothing to interleave: give at least one method")
    if isinstance(first_round, bool) or not isinstance(first_round, int) or first_round < 0:
        raise ValueError(f"first_round must be an integer >= 0, got {first_round!r}")
    indices = range(first_round, first_round + rounds)
    return _rounds(dict(calls), indices, order, warm_up, on_start, on_end)


def _rounds(
    calls: dict[str, Callable[[int], T]],
    indices: range,
    order: Order,
    warm_up: Callable[[str], object] | None,
    on_start: Callable[[str, int], None] | None,
    on_end: Callable[[str, int], None] | None,
) -> Iterator[dict[str, Timed[T]]]:
    """The loop itself: a generator apart, so that bad arguments fail at the call."""
    names = list(calls)
    if warm_up is not None:
        for name in names:
            warm_up(name)
    for round_index in indices:
        results: dict[str, Timed[T]] = {}
        for name in round_order(names, round_index, order):
            if on_start is not None:
                on_start(name, round_index)
            started = time.perf_counter()
            value = calls[name](round_index)
            results[name] = Timed(value, time.perf_counter() - started)
            if on_end is not None:
                on_end(name, round_index)
        yield results
