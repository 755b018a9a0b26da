from __future__ import annotations

import json

import pytest

from serving.errors import BadInputError
from tasks.bench.bench import DEFAULT_CONFIG, format_table, load_bench_config, run_bench, summarize


def test_shipped_config_loads_with_overrides():
    config = load_bench_config(DEFAULT_CONFIG, prompts_per_workload=1, threads=1)
    assert config.prompts_per_workload == 1 and config.threads == 1
    assert "hf-greedy" in [m.name for m in config.methods]


def test_config_without_the_baseline_is_refused(tmp_path):
    path = tmp_path / "bench.yaml"
    path.write_text("methods:\n  - {name: x, engine: specops, drafter: pld}\n")
    with pytest.raises(BadInputError, match="must include 'hf-greedy'"):
        load_bench_config(path)


def test_config_with_an_unknown_key_is_refused(tmp_path):
    path = tmp_path / "bench.yaml"
    path.write_text("prompt_count: 3\nmethods:\n  - {name: hf-greedy, engine: hf, mode: greedy}\n")
    with pytest.raises(BadInputError, match="prompt_count"):
        load_bench_config(path)


def _run(method, workload, tokens, seconds, identical=True, stats=None):
    return {
        "method": method,
        "workload": workload,
        "token_ids": list(range(tokens)),
        "seconds": seconds,
        "identical": identical,
        "stats": stats,
    }


def test_summary_pools_times_and_flags_differences():
    runs = [
        _run("hf-greedy", "a", 10, 2.0),
        _run("fast", "a", 10, 1.0),
        _run("hf-greedy", "b", 10, 2.0),
        _run("fast", "b", 10, 0.5, identical=False),
    ]
    rows = {(r["workload"], r["method"]): r for r in summarize(runs, ["hf-greedy", "fast"])}
    assert rows[("a", "fast")]["speedup"] == pytest.approx(2.0)
    assert rows[("b", "fast")]["speedup"] == pytest.approx(4.0)
    assert rows[("all", "fast")]["speedup"] == pytest.approx((20 / 1.5) / (20 / 4.0))
    assert rows[("a", "fast")]["identical"] and not rows[("all", "fast")]["identical"]
    assert "NO" in format_table(list(rows.values()))


@pytest.mark.real_model
def test_bench_runs_end_to_end_on_the_real_model(tmp_path, real_stock):
    config = load_bench_config(
        DEFAULT_CONFIG, prompts_per_workload=1, max_new_tokens=12, workloads=["grounded"]
    )
    config.methods = [m for m in config.methods if m.name in {"hf-greedy", "specops-pld"}]
    results = run_bench(config, out_dir=tmp_path, progress=False)
    written = json.loads((tmp_path / "bench.json").read_text())
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert written["environment"]["threads"] == config.threads
    assert {r["method"] for r in results["runs"]} == {"hf-greedy", "specops-pld"}
    assert all(r["identical"] for r in results["runs"])
