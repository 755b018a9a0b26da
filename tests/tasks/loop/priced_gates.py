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
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.evaluate import gates
from tasks.evaluate.gates import GateConfig

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
  draft_cost: 0.0
"""


def use_priced_gates(monkeypatch: pytest.MonkeyPatch, folder: Path) -> GateConfig:
    """Every gate decision from now on (until the test ends) reads ``folder/gates.yaml``,
    written with :data:`PRICED_GATES`, through the real loader."""
    path = Path(folder) / "gates.yaml"
    path.write_text(PRICED_GATES)
    real = gates.load_gates
    monkeypatch.setattr(gates, "load_gates", lambda config=path: real(config))
    return real(path)
