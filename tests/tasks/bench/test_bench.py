from __future__ import annotations

import json

import pytest

from serving.errors import BadInputError
from tasks.bench.bench import (
    DEFAULT_CONFIG,
    format_table,
    load_bench_config,
    run_bench,
    select_methods,
    summarize,
)


def test_shipped_config_loads_with_overrides():
    config = load_bench_config(DEFAULT_CONFIG, prompts_per_workload=1, threads=1)
    assert config.prompts_per_workload == 1 and config.threads == 1
    assert "hf-greedy" in [m.name for m in config.methods]


def test_selected_methods_keep_the_baseline_and_unknown_ones_are_named():
    config = select_methods(load_bench_config(DEFAULT_CONFIG), ["specops-pld"])
    assert [m.name for m in config.methods] == ["hf-greedy", "specops-pld"]
    with pytest.raises(BadInputError, match=r"unknown methods \['nope'\]; the config has"):
        select_methods(config, ["specops-pld", "nope"])


def test_config_without_the_baseline_is_refused(tmp_path):
    path = tmp_path / "bench.yaml"
    path.write_text("methods:\n  - {name: x, engine: specops, drafter: pld}\n")
    with pytest.raises(BadInputError, match="must include 'hf-greedy'"):
        load_bench_config(path)


def test_another_baseline_divides_the_speedups_and_references_the_rest(tmp_path):
    from tasks.bench.bench_config import pick_references

    path = tmp_path / "bench.yaml"
    path.write_text(
        "baseline: specops-none\nhardware: cpu-int4\nmethods:\n"
        "  - {name: specops-none, engine: specops, drafter: none}\n"
        "  - {name: specops-pld, engine: specops, drafter: pld}\n"
        "  - {name: hf-pld, engine: hf, mode: prompt_lookup}\n"
    )
    config = load_bench_config(path)
    assert pick_references(config) == {
        "specops-none": None, "specops-pld": "specops-none", "hf-pld": "specops-none",
    }  # fmt: skip
    assert [m.name for m in select_methods(config, ["hf-pld"]).methods] == [
        "specops-none", "hf-pld",
    ]  # fmt: skip
    runs = [_run("specops-none", "a", 10, 2.0), _run("specops-pld", "a", 10, 1.0)]
    rows = summarize(runs, ["specops-none", "specops-pld"], baseline="specops-none")
    pld = next(r for r in rows if r["method"] == "specops-pld" and r["workload"] == "a")
    assert pld["speedup"] == pytest.approx(2.0) and pld["reference"] == "specops-none"
    assert "(reference)" in format_table(rows)
    path.write_text("baseline: nope\nmethods:\n  - {name: hf-greedy, engine: hf, mode: greedy}\n")
    with pytest.raises(BadInputError, match="must include 'nope'"):
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


def test_rows_sum_accepted_drafts_by_stage_and_the_table_shows_the_shares():
    from serving.engine.metrics import StepRecord
    from serving.engine.metrics import summarize as request_stats

    def stats(*steps):
        return request_stats(list(steps), prompt_tokens=1, prefill_s=0.0, total_s=1.0).to_dict()

    runs = [
        _run("hf-greedy", "a", 10, 2.0),
        _run("mix", "a", 10, 1.0, stats=stats(StepRecord(4, 3, 4, 0, 0, "pld"))),
        _run("hf-greedy", "b", 10, 2.0),
        _run("mix", "b", 10, 1.0, stats=stats(StepRecord(4, 1, 2, 0, 0, "head"))),
    ]
    rows = {(r["workload"], r["method"]): r for r in summarize(runs, ["hf-greedy", "mix"])}
    assert rows[("all", "mix")]["accepted_by_stage"] == {"pld": 3, "head": 1}
    assert rows[("a", "mix")]["accepted_by_stage"] == {"pld": 3}
    table = format_table(list(rows.values()))
    assert "accepted by stage, all mix: pld 75% · head 25%" in table
    assert "accepted by stage, a mix" not in table  # one stage: no shares to show


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


# --- Methods per hardware target, references, llama.cpp rows --------------------------------
def _config(methods: list[dict], **settings):
    from tasks.bench.bench import BenchConfig

    return BenchConfig.model_validate({"methods": methods, **settings})


HF = {"name": "hf-greedy", "engine": "hf", "mode": "greedy"}
LLAMA = [
    {"name": "llama-plain", "engine": "llamacpp", "mode": "plain"},
    {"name": "llama-pld", "engine": "llamacpp", "mode": "prompt_lookup", "num_pred_tokens": 5},
]


def test_each_row_is_compared_with_the_plain_row_of_its_own_target():
    from tasks.bench.bench import llamacpp_reference, method_hardware, pick_references

    config = _config(
        [
            HF,
            {"name": "hf-pld", "engine": "hf", "mode": "prompt_lookup"},
            {"name": "fp32", "engine": "specops", "drafter": "none"},
            {"name": "fp32-pld", "engine": "specops", "drafter": "pld"},
            {"name": "stock-pld", "engine": "specops", "drafter": "pld", "hardware": "cpu-stock"},
            *LLAMA,
        ]
    )
    assert pick_references(config) == {
        "hf-greedy": None,
        "hf-pld": "hf-greedy",
        "fp32": "hf-greedy",  # a plain row is checked against HF greedy
        "fp32-pld": "fp32",  # same target (the bench's default, cpu)
        "stock-pld": "hf-greedy",  # cpu-stock has no plain row in this config
        "llama-plain": "hf-greedy",
        "llama-pld": "llama-plain",
    }
    assert llamacpp_reference(config) == "llama-plain"
    assert [method_hardware(m, config) for m in config.methods] == [
        None,
        None,
        "cpu",
        "cpu",
        "cpu-stock",
        None,
        None,
    ]


def test_a_method_must_fit_its_engine():
    with pytest.raises(ValueError, match="'llamacpp' takes mode one of"):
        _config([HF, {"name": "x", "engine": "llamacpp", "mode": "greedy"}])
    with pytest.raises(ValueError, match="hardware, drafter and cascade are specops settings"):
        _config([HF, {"name": "x", "engine": "llamacpp", "mode": "plain", "hardware": "cpu"}])
    with pytest.raises(ValueError, match="'specops' takes no mode"):
        _config([HF, {"name": "x", "engine": "specops", "mode": "greedy"}])


def test_an_unknown_hardware_target_names_its_method():
    from tasks.bench.bench import resolve_hardware

    config = _config([HF, {"name": "fast", "engine": "specops", "hardware": "cpu-int9"}])
    with pytest.raises(BadInputError, match=r"method 'fast'.*cpu-int9"):
        resolve_hardware(config)


def test_the_engines_config_loads():
    from serving.paths import CONFIG_DIR

    config = load_bench_config(CONFIG_DIR / "bench-engines.yaml")
    engines = {m.engine for m in config.methods}
    assert engines == {"hf", "specops", "llamacpp"}


def test_summary_divides_by_llama_plain_and_the_physical_limit():
    runs = [
        _run("hf-greedy", "a", 10, 2.0),
        _run("llama", "a", 10, 0.5),
        _run("fast", "a", 10, 1.0),
    ]
    rows = summarize(
        runs,
        ["hf-greedy", "llama", "fast"],
        references={"hf-greedy": None, "llama": "hf-greedy", "fast": "hf-greedy"},
        llamacpp_plain="llama",
        weights={"fast": {"format": "cpu", "bytes_per_token": 10**6}},
        bandwidth_bytes_per_s=1e8,  # limit: 100 tok/s
    )
    fast = next(r for r in rows if r["workload"] == "a" and r["method"] == "fast")
    assert fast["x_llama"] == pytest.approx(0.5)
    assert fast["limit_tokens_per_s"] == pytest.approx(100.0)
    assert fast["of_limit"] == pytest.approx(0.1)
    table = format_table(rows, [{"method": "gone", "reason": "because"}])
    assert "x llama" in table and "% limit" in table and "skipped gone: because" in table


def test_without_the_llamacpp_environment_its_rows_are_skipped_and_the_bench_runs(
    tmp_path, model_folder, monkeypatch
):
    import tasks.data.traffic as traffic
    from tasks.bench.llamacpp import INSTALL, PYTHON_VARIABLE
    from tasks.data.prompts import Prompt

    monkeypatch.setenv(PYTHON_VARIABLE, str(tmp_path / "no-such-env" / "bin" / "python"))
    prompt = Prompt(
        id="p0",
        workload="grounded",
        messages=[{"role": "user", "content": "Repeat: one two three, one two three."}],
        reference=None,
        split="heldout",
    )
    monkeypatch.setattr(traffic, "build_workload", lambda *args, **kwargs: [prompt])
    config = _config(
        [
            HF,
            {"name": "stock", "engine": "specops", "drafter": "none", "hardware": "cpu-stock"},
            {"name": "stock-pld", "engine": "specops", "drafter": "pld", "hardware": "cpu-stock"},
            {"name": "packed-pld", "engine": "specops", "drafter": "pld", "k": 3},
            *LLAMA,
        ],
        workloads=["grounded"],
        prompts_per_workload=1,
        max_new_tokens=6,
        threads=1,
        bandwidth_mb=8,
    )
    results = run_bench(config, out_dir=tmp_path, target=str(model_folder), progress=False)

    assert [s["method"] for s in results["skipped"]] == ["llama-plain", "llama-pld"]
    assert all(INSTALL in s["reason"] for s in results["skipped"])
    assert {r["method"] for r in results["runs"]} == {
        "hf-greedy",
        "stock",
        "stock-pld",
        "packed-pld",
    }
    assert results["references"] == {
        "hf-greedy": None,
        "stock": "hf-greedy",
        "stock-pld": "stock",
        "packed-pld": "hf-greedy",
    }
    assert all(r["identical"] for r in results["runs"])
    environment = results["environment"]
    assert environment["memory_bandwidth"]["bytes_per_s"] > 0
    assert environment["llamacpp"] is None
    assert environment["specops_targets"]["cpu-stock"]["kernels"] == "stock"
    weights = environment["weights"]
    # The stock target shares the HF model; the packed one adds one row of the token table.
    assert weights["stock"]["bytes_per_token"] == weights["hf-greedy"]["bytes_per_token"]
    assert weights["packed-pld"]["bytes_per_token"] > weights["stock"]["bytes_per_token"]
    row = next(r for r in results["summary"] if r["workload"] == "all" and r["method"] == "stock")
    assert row["limit_tokens_per_s"] > 0 and row["of_limit"] > 0 and row["x_llama"] is None
    table = format_table(results["summary"], results["skipped"])
    assert "skipped llama-plain" in table and INSTALL in table
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["skipped"] == results["skipped"]
