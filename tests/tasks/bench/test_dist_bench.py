"""The distributed benchmark's grid on the tiny target, in process: every point runs,
every output equals plain decoding's, and the report files are written."""

from __future__ import annotations

import json

import pytest

from serving.distributed.client import TargetClient
from serving.distributed.server import TargetService, serve_target
from serving.errors import BadInputError
from serving.target import LoadedTarget
from tasks.bench.distributed import (
    DistributedBenchSettings,
    crossover,
    run_distributed_bench,
    write_report,
)

PROMPTS = [[1, 5, 17, 42, 8, 5, 17, 42, 33, 9, 5, 17], [1, 9, 9, 4, 7, 9, 9, 4, 7, 9]]


@pytest.fixture
def client(target):
    running = serve_target(TargetService(LoadedTarget.of(target), eos_token_ids=[]))
    with TargetClient(f"127.0.0.1:{running.port}") as made:
        yield made
    running.stop()


def test_grid_runs_and_every_mode_equals_plain(client, tmp_path):
    settings = DistributedBenchSettings(
        rtt_ms=[0.0, 4.0], sessions=[1, 2], requests=2, max_new_tokens=12, drafter="pld"
    )
    results = run_distributed_bench(client, PROMPTS, settings, progress=False)
    points = results["points"]
    assert len(points) == 2 * (1 + 2 * 2)
    assert results["all_equal_to_plain"] is True
    assert all(p["equal_to_plain"] == p["requests"] for p in points)
    assert {(r["rtt_ms"], r["sessions"]) for r in results["table"]} == {
        (0.0, 1), (0.0, 2), (4.0, 1), (4.0, 2)
    }  # fmt: skip
    one = next(p for p in points if p["mode"] == "distributed" and p["sessions"] == 1)
    # A distributed request makes a round trip per step, plus start and finalize.
    steps = sum(len(r["steps"]) for r in one["per_request"])
    assert one["round_trips_per_request"] == pytest.approx(steps / one["requests"] + 2)
    paths = write_report(results, tmp_path / "d.json")
    saved = json.loads(paths["json"].read_text())
    assert "crossover_rtt_ms" in saved
    assert "| RTT (ms) |" in paths["table"].read_text()
    assert paths["plot"].stat().st_size > 0


def test_crossover_is_the_first_rtt_where_fused_wins():
    rows = [
        {"rtt_ms": 0.0, "sessions": 1, "better": "distributed"},
        {"rtt_ms": 5.0, "sessions": 1, "better": "fused"},
        {"rtt_ms": 20.0, "sessions": 1, "better": "fused"},
        {"rtt_ms": 0.0, "sessions": 2, "better": "distributed"},
    ]
    assert crossover(rows) == {1: 5.0, 2: None}


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("rtt_ms", [-1.0], "rtt_ms"),
        ("sessions", [0], "sessions"),
        ("drafter", "none", "nothing to compare"),
        ("drafter", "bogus", "bogus"),
    ],
)
def test_bad_settings_are_refused_by_name(field, value, match):
    settings = DistributedBenchSettings(**{field: value})
    with pytest.raises(BadInputError, match=match):
        settings.check()
