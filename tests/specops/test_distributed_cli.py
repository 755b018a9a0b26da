"""``specops distributed``: bad input ends in one line naming it, not a traceback."""

from __future__ import annotations

from typer.testing import CliRunner

from specops.cli import app

runner = CliRunner()


def test_bench_refuses_bad_sessions():
    result = runner.invoke(app, ["distributed", "bench", "--sessions", "0,2"])
    assert result.exit_code == 2
    assert "sessions must be integers >= 1" in result.output


def test_bench_refuses_a_list_that_is_not_numbers():
    result = runner.invoke(app, ["distributed", "bench", "--rtt-ms", "0,fast"])
    assert result.exit_code == 2
    assert "'0,fast'" in result.output


def test_client_without_a_server_names_the_address():
    result = runner.invoke(
        app, ["distributed", "client", "hello", "--address", "127.0.0.1:9", "--drafter", "pld"]
    )
    assert result.exit_code == 2
    assert "no target server at 127.0.0.1:9" in result.output
