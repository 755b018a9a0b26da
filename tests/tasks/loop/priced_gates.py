"""Gates that price speed by a fixed cost profile, for tests whose subject is what the loop
does with a verdict (log it, promote, export, register once), not whether the tiny target
happens to be fast enough on a busy machine.

The profile (:mod:`tasks.evaluate.priced`): a target pass over up to 17 tokens (16 drafts,
the most any target drafts, ``serving.hardware``) costs as much as a one-token pass, and
drafting is free, as for a memory-bound target and a lookup drafter. Under it a lossless
draft can only save passes (every check costs one pass and emits at least one token), so
with no gain required the gates must pass it: the verdict is a fact, the same on every
machine. The wall clock's interval check is off for the same reason: it reads the
clock (tests/tasks/evaluate/test_interval.py tests it), so one timed round does; and so
is the pre-gate, which
predicts with the contenders' own profiled costs, not this profile
(tests/tasks/evaluate/test_pregate.py).

:func:`use_priced_policy` goes one step further, for a test that compares the steps
themselves (tests/specops/loop_digest.py): the cost-aware draft-length policy prices drafting
at the profile's cost too, instead of the seconds it measures while decoding (or those an
evaluation profiled), so that the k it picks, and a greedy request's steps, depend only on
what was accepted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.engine.policy import CostAwareK
from tasks.evaluate import gates
from tasks.evaluate.gates import GateConfig

PRICED_DRAFT_COST = 0.0  # one drafted token, in one-token target passes

PRICED_GATES = f"""\
min_prompts: 4
min_speedup_gain: 0.0
max_mean_accepted_length_drop: 0.05
max_workload_slowdown: 0.10
wall_clock_confidence: 0
wall_clock_rounds: 1
pregate_margin: null
speed_profile:
  verify_curve: [{", ".join(["1.0"] * 17)}]
  draft_cost: {PRICED_DRAFT_COST}
"""


def use_priced_gates(monkeypatch: pytest.MonkeyPatch, folder: Path) -> GateConfig:
    """Every gate decision from now on (until the test ends) reads ``folder/gates.yaml``,
    written with :data:`PRICED_GATES`, through the real loader."""
    path = Path(folder) / "gates.yaml"
    path.write_text(PRICED_GATES)
    real = gates.load_gates
    monkeypatch.setattr(gates, "load_gates", lambda config=path: real(config))
    return real(path)


def use_priced_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cost-aware draft-length policy (until the test ends) prices a drafted token at
    :data:`PRICED_DRAFT_COST`, whatever it measured or was given: its choice of k then reads
    only the acceptance it saw and the target's fixed verify curve (configs/hardware.yaml)."""
    monkeypatch.setattr(CostAwareK, "draft_cost", lambda self: PRICED_DRAFT_COST)
