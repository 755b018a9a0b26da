"""The overload study's pieces that need no server: the counters it reads from a server's
metrics, and the clear refusal when locust is missing."""

import shutil

import pytest

from benchmarks.overload import _check_generator, main, server_counts
from serving.errors import SpecOpsError
from serving.hardware import hardware_target
from serving.server.metrics import ServerMetrics


def test_server_counts_reads_tokens_statuses_and_refusals():
    metrics = ServerMetrics(model_name="smollm2", hardware=hardware_target("cpu"))
    metrics.labels(metrics.generation_tokens).inc(64)
    metrics.labels(metrics.requests, finished_reason="length").inc(1)
    metrics.error(429)
    metrics.error(429)
    metrics.labels(metrics.rejected, reason="queue_full").inc(2)
    metrics.set_queue(running=3, waiting=1)
    metrics.observe_pass(size=3, tokens=12)
    metrics.observe_pass(size=2, tokens=8)
    counts = server_counts(metrics.render().decode())
    assert counts.pop("server_cpu_s") > 0
    assert counts == {
        "tokens": 64.0,
        "finished": 1.0,
        "status_429": 2.0,
        "refused_queue_full": 2.0,
        "busy": 4.0,
        "passes": 2.0,
        "request_steps": 5.0,
    }


@pytest.mark.skipif(shutil.which("locust") is not None, reason="locust is installed here")
def test_without_locust_the_study_says_how_to_install_it(capsys, tmp_path):
    with pytest.raises(SpecOpsError, match="pip install locust"):
        _check_generator("locust")
    assert main(["--out", str(tmp_path / "out" / "overload.json")]) == 2
    assert "--generator asyncio" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything started
