"""Bench runs combined: medians and spreads per (workload, method)."""

from __future__ import annotations

import json

import pytest

from serving.errors import BadInputError
from tasks.bench.repeats import combine, main


def _run(speeds: dict[str, float], names=("llama-plain", "specops-int4")) -> dict:
    return {
        "config": {"methods": [{"name": n} for n in names]},
        "summary": [
            {
                "workload": "code",
                "method": name,
                "tokens_per_s": speed,
                "x_llama": speed / speeds["llama-plain"],
                "identical": True,
            }
            for name, speed in speeds.items()
        ],
    }


def test_medians_and_spreads_over_runs():
    runs = [_run({"llama-plain": 50, "specops-int4": s}) for s in (60, 75, 40)]
    rows = {r["method"]: r for r in combine(runs)}
    int4 = rows["specops-int4"]
    assert int4["runs"] == 3 and int4["tokens_per_s"] == 60
    assert (int4["tokens_per_s_min"], int4["tokens_per_s_max"]) == (40, 75)
    assert int4["x_llama"] == pytest.approx(1.2)


def test_runs_of_different_configs_are_refused(tmp_path):
    with pytest.raises(BadInputError, match="different bench configs"):
        combine(
            [
                _run({"llama-plain": 1, "specops-int4": 1}),
                _run({"llama-plain": 1}, names=("llama-plain",)),
            ]
        )
    with pytest.raises(BadInputError, match="no bench results"):
        main([str(tmp_path / "missing"), "--out", str(tmp_path / "out.json")])


def test_the_command_writes_the_combined_file(tmp_path, capsys):
    for i, speed in enumerate((60, 70)):
        folder = tmp_path / f"r{i}"
        folder.mkdir()
        (folder / "bench.json").write_text(
            json.dumps(_run({"llama-plain": 50, "specops-int4": speed}))
        )
    main([str(tmp_path / "r0"), str(tmp_path / "r1"), "--out", str(tmp_path / "all.json")])
    assert "| code | specops-int4 | 65.0 (60.0–70.0) | 1.30" in capsys.readouterr().out
    assert json.loads((tmp_path / "all.json").read_text())["summary"][1]["tokens_per_s"] == 65


def test_ratios_against_a_method_are_taken_within_each_run(tmp_path, capsys):
    # Run 2 is slower throughout (a noisy machine): its ratio is what counts, not its speed.
    runs = [_run({"llama-plain": p, "specops-int4": s}) for p, s in ((50, 100), (25, 45))]
    rows = {r["method"]: r for r in combine(runs, "llama-plain")}
    int4 = rows["specops-int4"]
    assert int4["x_against"] == pytest.approx(1.9) and int4["against"] == "llama-plain"
    assert (int4["x_against_min"], int4["x_against_max"]) == (pytest.approx(1.8), 2.0)
    assert rows["llama-plain"]["x_against"] == 1.0
    with pytest.raises(BadInputError, match="'hf-greedy' is not a method"):
        combine(runs, "hf-greedy")
    for i, run in enumerate(runs):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "bench.json").write_text(json.dumps(run))
    main([str(tmp_path / "r0"), str(tmp_path / "r1"), "--out", str(tmp_path / "o.json"),
          "--against", "llama-plain"])  # fmt: skip
    assert "× llama-plain |" in capsys.readouterr().out
