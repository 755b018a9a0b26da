"""The load test's aggregation, option checks, report files and level loop, without a
server: samples are made up here and the one-request call is replaced by a fake."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from serving.errors import BadInputError
from specops.cli import app
from tasks.ops import loadtest
from tasks.ops.loadtest import (
    LoadTestSettings,
    _one,
    _Sample,
    check_levels,
    compare_outputs,
    markdown_table,
    parse_levels,
    run_load_sweep,
    run_load_test,
    sweep_results,
    write_report,
)

MB = 2**20


def ok(index: int, text: str, *, tokens: int = 10, latency: float = 1.0, prompts: int = 4):
    return _Sample(
        ok=True,
        latency_s=latency,
        ttft_s=latency / 10,
        completion_tokens=tokens,
        draft_tokens=8,
        accepted_tokens=4,
        checks=5,
        index=index,
        prompt_index=index % prompts,
        text=text,
    )


def failed(index: int, error: str = "RateLimitError", *, prompts: int = 4):
    return _Sample(False, 0.5, error=error, index=index, prompt_index=index % prompts)


def level(texts: list[str], **kwargs) -> list[_Sample]:
    # Completion order differs from request order, as under load.
    return [ok(i, text, **kwargs) for i, text in reversed(list(enumerate(texts)))]


TEXTS = ["a", "b", "c", "d"]


def measured(*levels: tuple[int, list[_Sample], float]):
    return {clients: (samples, wall, [1000 * MB, 1200 * MB]) for clients, samples, wall in levels}


def test_levels_are_parsed_sorted_and_deduplicated():
    assert parse_levels("1,2,4,8") == [1, 2, 4, 8]
    assert parse_levels(" 8, 1,2,1") == [1, 2, 8]


@pytest.mark.parametrize("text, bad", [("1,x", "x"), ("0", "0"), ("2,-1", "-1"), ("1.5", "1.5"),
                                       ("1,,2", ""), ("", "")])  # fmt: skip
def test_bad_levels_name_the_value(text, bad):
    with pytest.raises(BadInputError, match=f"clients must be positive integers, got '{bad}'"):
        parse_levels(text)


def test_a_level_above_the_request_count_is_refused():
    assert check_levels([4, 1], 4) == [1, 4]
    with pytest.raises(BadInputError, match=r"requests \(4\) is below .* level \(8\)"):
        check_levels([1, 8], 4)
    with pytest.raises(BadInputError, match="at least one clients level"):
        check_levels([], 4)


def test_only_loopback_is_targeted():
    with pytest.raises(BadInputError, match="only targets loopback"):
        LoadTestSettings(url="http://10.0.0.1:8000").check()
    with pytest.raises(BadInputError, match="only targets loopback"):
        LoadTestSettings(url="https://10.0.0.1:8000").check()


def test_an_https_server_is_verified_with_the_ca_file(tls_files, tmp_path):
    settings = LoadTestSettings(url="https://127.0.0.1:8443", tls_ca=tls_files.ca)
    settings.check()
    verify = settings.verify()
    assert verify is not None and verify.get_ca_certs()[0]["subject"]
    assert LoadTestSettings(url="https://localhost:8443").verify() is not None  # the system's
    assert LoadTestSettings(url="http://127.0.0.1:8000").verify() is None
    with pytest.raises(BadInputError, match=r"a CA file \(tls_ca\) is for an https server"):
        LoadTestSettings(url="http://127.0.0.1:8000", tls_ca=tls_files.ca).check()
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("nothing\n")
    with pytest.raises(BadInputError, match="holds no PEM certificate"):
        LoadTestSettings(url="https://127.0.0.1:8443", tls_ca=not_pem).check()


def test_levels_are_summarised_against_the_one_client_level():
    results = sweep_results(
        LoadTestSettings(requests=4),
        measured((1, level(TEXTS), 8.0), (2, level(TEXTS), 5.0), (4, level(TEXTS), 4.0)),
        warmup=ok(0, "a"),
    )
    one, two, four = results["levels"]
    assert [lv["clients"] for lv in results["levels"]] == [1, 2, 4]
    assert one["tokens_per_s"] == pytest.approx(40 / 8) and one["requests_per_s"] == 0.5
    assert [lv["speedup_vs_one_client"] for lv in (one, two, four)] == pytest.approx([1, 1.6, 2])
    assert one["acceptance_rate"] == 0.5 and one["mean_accepted_length"] == 2.0
    assert one["server_rss_mb"]["peak"] == 1200
    assert results["outputs_equal"] is True and four["mismatched_prompts"] == []
    assert results["baseline_clients"] == 1 and results["clients_levels"] == [1, 2, 4]
    assert results["warmup"] == {"ok": True, "latency_s": 1.0, "error": None}
    assert "clients" not in results["settings"] and "prompts" not in results["settings"]
    assert results["table"][1]["speedup_vs_one_client"] == pytest.approx(1.6)


def test_a_different_greedy_output_is_named_by_prompt_and_failures_are_not_compared():
    batched = level(["a", "B", "c", "D"])
    batched[0] = failed(3)  # prompt 3 failed here: counted as an error, not compared
    results = sweep_results(
        LoadTestSettings(requests=4),
        measured((1, level(TEXTS), 4.0), (2, batched, 4.0)),
        warmup=failed(0, "APIConnectionError"),
    )
    two = results["levels"][1]
    assert two["outputs_equal"] is False and two["mismatched_prompts"] == [1]
    assert two["compared_prompts"] == 3
    assert two["errors"] == 1 and two["errors_by_kind"] == {"RateLimitError": 1}
    assert results["outputs_equal"] is False
    assert results["warmup"]["error"] == "APIConnectionError"


def test_repeated_prompts_are_compared_with_the_reference_levels_first_text():
    reference = [ok(i, t, prompts=2) for i, t in enumerate(["a", "b", "a", "b"])]
    batched = [ok(i, t, prompts=2) for i, t in enumerate(["a", "b", "a", "x"])]
    assert compare_outputs(reference, batched) == (2, [1])
    # Nondeterminism inside the reference level shows up against itself.
    assert compare_outputs(batched, batched) == (2, [1])


def test_the_lowest_level_is_the_reference_when_it_is_not_one_client():
    results = sweep_results(
        LoadTestSettings(requests=4),
        measured((2, level(TEXTS), 4.0), (8, level(["a", "b", "c", "z"]), 2.0)),
        warmup=ok(0, "a"),
    )
    assert results["baseline_clients"] == 2
    assert [lv["speedup_vs_one_client"] for lv in results["levels"]] == [1.0, 2.0]
    assert results["levels"][1]["mismatched_prompts"] == [3]
    assert "| clients | tokens/s | × 2 clients |" in markdown_table(results)


def test_outputs_are_not_compared_when_sampling():
    results = sweep_results(
        LoadTestSettings(requests=4, temperature=0.7),
        measured((1, level(TEXTS), 4.0), (2, level(["w", "x", "y", "z"]), 4.0)),
        warmup=ok(0, "a"),
    )
    assert results["outputs_equal"] is None
    assert [lv["outputs_equal"] for lv in results["levels"]] == [None, None]
    assert markdown_table(results).splitlines()[-1].endswith("| 0 | n/a |")


def test_the_table_has_one_row_per_level():
    batched = level(TEXTS, latency=2.0)
    batched[0] = ok(3, "D", latency=2.0)
    results = sweep_results(
        LoadTestSettings(requests=4),
        measured((1, level(TEXTS), 8.0), (2, batched, 5.0)),
        warmup=ok(0, "a"),
    )
    assert markdown_table(results).splitlines() == [
        "| clients | tokens/s | × one client | req/s | p50 latency s | p90 | TTFT p50 "
        "| peak RSS MB | errors | outputs equal |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| 1 | 5.0 | 1.00 | 0.50 | 1.00 | 1.00 | 0.10 | 1200 | 0 | yes |",
        "| 2 | 8.0 | 1.60 | 0.80 | 2.00 | 2.00 | 0.20 | 1200 | 0 | NO: prompts 3 |",
    ]


def test_a_level_where_everything_failed_renders_without_figures(tmp_path):
    results = sweep_results(
        LoadTestSettings(requests=2), measured((1, [failed(0), failed(1)], 1.0)), failed(0)
    )
    row = markdown_table(results).splitlines()[-1]
    assert row == "| 1 | 0.0 | n/a | 0.00 | n/a | n/a | n/a | 1200 | 2 | n/a |"
    assert results["outputs_equal"] is None
    assert write_report(results, tmp_path / "r.json")["plot"].is_file()


def test_the_report_is_written_beside_the_results_file(tmp_path):
    results = sweep_results(
        LoadTestSettings(requests=4),
        measured((1, level(TEXTS), 8.0), (2, level(TEXTS), 5.0), (4, level(TEXTS), 4.0)),
        warmup=ok(0, "a"),
    )
    written = write_report(results, tmp_path / "out" / "loadtest.json")
    assert json.loads(written["json"].read_text())["levels"][2]["clients"] == 4
    assert written["table"].read_text() == markdown_table(results)
    assert written["plot"].name == "loadtest.png"
    assert written["plot"].read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "loadtest.json",
        "loadtest.md",
        "loadtest.png",
    ]


@pytest.fixture
def fake_server(monkeypatch):
    """Replace the one-request call: greedy answers are the prompt reversed, in flight
    requests are counted; /metrics is never read."""
    calls: list[tuple[str, str]] = []
    in_flight = {"now": 0, "peak": 0}

    async def one(client, settings, prompt):
        in_flight["now"] += 1
        in_flight["peak"] = max(in_flight["peak"], in_flight["now"])
        calls.append((prompt, client.base_url.host))
        await asyncio.sleep(0.001)
        in_flight["now"] -= 1
        return _Sample(True, 0.001, ttft_s=0.0005, completion_tokens=3, text=prompt[::-1])

    async def no_memory(url, stop, peaks):
        peaks.append(500 * MB)
        await stop.wait()

    monkeypatch.setattr(loadtest, "_one", one)
    monkeypatch.setattr(loadtest, "_sample_memory", no_memory)
    return calls, in_flight


def test_a_sweep_warms_up_once_then_runs_every_level_on_the_same_prompts(fake_server):
    calls, in_flight = fake_server
    settings = LoadTestSettings(requests=6, prompts=["p0", "p1", "p2", "p3"])
    results = asyncio.run(run_load_sweep(settings, [4, 1, 2], progress=False))
    prompts = [prompt for prompt, _ in calls]
    assert prompts[0] == "p0"  # the warm-up, not measured
    assert len(prompts) == 1 + 3 * 6
    assert sorted(prompts[1:7]) == sorted(prompts[7:13]) == sorted(prompts[13:])
    assert prompts[1:7] == ["p0", "p1", "p2", "p3", "p0", "p1"]  # one client: in order
    assert in_flight["peak"] == 4
    assert [lv["clients"] for lv in results["levels"]] == [1, 2, 4]
    assert [lv["requests"] for lv in results["levels"]] == [6, 6, 6]
    assert results["outputs_equal"] is True
    assert results["levels"][0]["server_rss_mb"]["peak"] == 500


def test_one_level_keeps_the_flat_summary(fake_server):
    settings = LoadTestSettings(clients=2, requests=4, prompts=["p0", "p1"])
    results = asyncio.run(run_load_test(settings, progress=False))
    assert results["succeeded"] == 4 and results["errors"] == 0 and results["clients"] == 2
    assert results["latency_s"]["p50"] > 0 and results["tokens_per_s"] > 0
    assert results["server_rss_mb"]["peak"] == 500 and results["warmup"]["ok"]


def _stream(pieces: list[str | None], usage):
    async def chunks():
        for piece in pieces:
            delta = SimpleNamespace(content=piece)
            yield SimpleNamespace(choices=[SimpleNamespace(delta=delta)], usage=None)
        yield SimpleNamespace(choices=[], usage=usage)

    return chunks()


def _client(seen: list[dict]):
    usage = SimpleNamespace(
        completion_tokens=3,
        model_extra={"speculative": {"draft_tokens": 4, "accepted_tokens": 2, "checks": 2}},
    )

    async def create(**kwargs):
        seen.append(kwargs)
        return _stream(["He", None, "llo"], usage)

    return SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))


@pytest.mark.parametrize(
    "settings, extra_body",
    [
        (LoadTestSettings(), None),
        (LoadTestSettings(skeleton=True), {"skeleton": True}),
        (LoadTestSettings(skeleton=True, drafter="pld:3"), {"drafter": "pld:3", "skeleton": True}),
    ],
)
def test_a_request_keeps_its_text_and_passes_skeleton_only_when_asked(settings, extra_body):
    seen: list[dict] = []
    sample = asyncio.run(_one(_client(seen), settings, "hi"))
    assert seen[0]["extra_body"] == extra_body and seen[0]["temperature"] == 0.0
    assert sample.ok and sample.text == "Hello" and sample.ttft_s is not None
    assert (sample.completion_tokens, sample.draft_tokens, sample.checks) == (3, 4, 2)


runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--clients", "1,x"], "clients must be positive integers, got 'x'"),
        (["--clients", "0"], "clients must be positive integers, got '0'"),
        (["--clients", "1,16", "--requests", "8"], "requests (8) is below"),
        (["--requests", "0"], "requests must be an integer >= 1, got 0"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--url", "http://10.0.0.1:8000"], "only targets loopback addresses"),
    ],
)
def test_bad_loadtest_options_fail_before_any_server_starts(args, fragment, tmp_path):
    result = runner.invoke(app, ["loadtest", *args, "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "r.server.log").exists()
