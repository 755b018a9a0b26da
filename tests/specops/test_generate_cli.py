"""``specops generate`` on the tiny target: the streamed text is the answer, the statistics
follow on stderr, and ``--json`` holds the same greedy tokens (option errors are in
test_cli.py)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from specops.cli import app
from specops.generate_cli import format_stats

runner = CliRunner()


def _generate(target_dir, *args: str):
    common = ["--target", str(target_dir), "--hardware", "cpu-stock", "--threads", "1"]
    return runner.invoke(
        app, ["generate", "abc abc abc abc", *common, "--no-chat", "--max-new-tokens", "8", *args]
    )


def test_streamed_text_and_json_agree_and_stats_go_to_stderr(target_dir):
    as_json = _generate(target_dir, "--json")
    assert as_json.exit_code == 0, as_json.output
    payload = json.loads(as_json.stdout)
    assert 1 <= len(payload["token_ids"]) <= 8
    assert payload["stats"]["generated_tokens"] == len(payload["token_ids"])
    assert payload["threads"] == 1 and "---" not in as_json.stderr  # no statistics block
    streamed = _generate(target_dir)
    assert streamed.exit_code == 0, streamed.output
    assert streamed.stdout == payload["text"] + "\n"  # greedy: the same tokens
    stats = payload["stats"]
    assert f"tokens: {stats['generated_tokens']} in {stats['checks']} target passes" in (
        streamed.stderr
    )
    assert "acceptance by position: [" in streamed.stderr


def test_stats_read_as_three_lines_with_missing_numbers_named():
    stats = {
        "generated_tokens": 5, "checks": 3, "tokens_per_s": 41.25, "acceptance_rate": None,
        "mean_accepted_length": 1.666, "acceptance_by_position": [1.0, 0.5],
        "prefill_s": 0.01, "draft_s": 0.002, "verify_s": 0.1, "total_s": 0.12,
    }  # fmt: skip
    assert format_stats(stats).splitlines() == [
        "tokens: 5 in 3 target passes | 41.2 tok/s | acceptance n/a | mean accepted length 1.67",
        "acceptance by position: [1.00, 0.50]",
        "time: prefill 0.010s, draft 0.002s, verify 0.100s, total 0.120s",
    ]
    assert "acceptance by position: [n/a]" in format_stats(stats | {"acceptance_by_position": []})
