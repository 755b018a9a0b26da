"""``specops distributed``: bad input ends in one line naming it, not a traceback; the
target server started on the tiny target serves one request and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from typer.testing import CliRunner

from specops.cli import app

runner = CliRunner()
PROMPT = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
KEY = "sk-serve-target-0123456789abcdef"
WRONG_KEY = "sk-not-the-key-0123456789abcdef"


def _key_file(folder):
    path = folder / "keys"
    path.write_text(f"{KEY}\n")
    os.chmod(path, 0o600)
    return path


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


def _talk_then_stop(ready, handler, done: threading.Event, seen: dict, **access) -> None:
    """Wait for the port, ask the server once (``access``: the client's key and TLS), then
    send SIGTERM as an operator would: only once the command's own handler is installed
    (else it would reach pytest's)."""
    from serving.distributed.client import RemoteError, TargetClient, run_distributed

    try:
        deadline = time.monotonic() + 300
        while not ready.is_file() and not done.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not ready.is_file():
            return
        seen["port"] = int(ready.read_text())
        address = f"127.0.0.1:{seen['port']}"
        if access:  # first without the key: refused, and the model never asked
            with TargetClient(address, api_key=WRONG_KEY, tls_ca=access["tls_ca"]) as remote:
                try:
                    remote.info()
                except RemoteError as error:
                    seen["refused"] = error.code
        with TargetClient(address, timeout_s=60, **access) as remote:
            remote.wait_ready(10.0)
            seen["info"] = remote.info()
            seen["result"] = run_distributed(
                remote, PROMPT, drafter=None, policy=None, max_new_tokens=6
            )
    finally:
        while signal.getsignal(signal.SIGTERM) is handler and not done.is_set():
            time.sleep(0.01)
        if not done.is_set():
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_serve_target_serves_the_tiny_target_until_sigterm(
    target_dir, tmp_path, host, tls_files, monkeypatch
):
    """Beyond loopback with a key file and TLS (a certificate made for the test): the
    client needs the key and the CA; on loopback, plain and open."""
    import grpc

    from serving.engine.decoder import SpeculativeDecoder
    from serving.hardware import engine_target
    from serving.loader import load_target

    ready = tmp_path / "port"
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    done, seen = threading.Event(), {}
    secure = host != "127.0.0.1"
    access = {"api_key": KEY, "tls_ca": tls_files.ca} if secure else {}
    client = threading.Thread(
        target=_talk_then_stop, args=(ready, handlers[signal.SIGTERM], done, seen), kwargs=access
    )
    client.start()
    args = ["--host", host, "--port", "0", "--target", str(target_dir), "--hardware", "cpu-stock",
            "--threads", "1", "--max-block", "5", "--max-sessions", "3",
            "--ready-file", str(ready)]  # fmt: skip
    if secure:
        monkeypatch.delenv("SPECOPS_API_KEYS", raising=False)
        args += ["--api-key-file", str(_key_file(tmp_path)), "--tls-cert", str(tls_files.cert),
                 "--tls-key", str(tls_files.key)]  # fmt: skip
    try:
        result = runner.invoke(app, ["distributed", "serve-target", *args])
    finally:
        done.set()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        client.join()
    assert result.exit_code == 0, result.output
    access_line = "(TLS, API keys: 1)" if secure else "(no TLS, no API key (open))"
    assert f"target server on {host}:{seen['port']} {access_line}" in result.output
    if secure:
        assert seen["refused"] == grpc.StatusCode.UNAUTHENTICATED
    info = seen["info"]
    assert (info.model, info.vocab_size) == (str(target_dir), 96)
    assert (info.max_block, info.max_sessions) == (5, 3)  # the options reached the server
    loaded = load_target(str(target_dir), engine_target("cpu-stock"))
    plain = SpeculativeDecoder(loaded).generate(PROMPT, max_new_tokens=6)  # the target's EOS
    assert seen["result"].token_ids == plain.token_ids  # the target's own greedy output


def test_serve_target_refuses_an_address_it_cannot_bind(target_dir, tmp_path):
    """An address that is not this machine's: one line naming it, exit 2."""
    ready = tmp_path / "port"
    args = ["--host", "192.0.2.1", "--port", "0", "--target", str(target_dir),
            "--hardware", "cpu-stock", "--ready-file", str(ready),
            "--allow-unauthenticated"]  # fmt: skip
    result = runner.invoke(app, ["distributed", "serve-target", *args])
    assert result.exit_code == 2, result.output
    assert "cannot bind the target server to 192.0.2.1:0" in result.output
    assert not ready.exists()


def test_serve_target_beyond_loopback_without_a_key_is_refused_before_the_model(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("SPECOPS_API_KEYS", raising=False)
    args = ["--host", "0.0.0.0", "--target", str(tmp_path / "no-model-here")]
    result = runner.invoke(app, ["distributed", "serve-target", *args])
    assert result.exit_code == 2, result.output
    assert "refusing to bind '0.0.0.0'" in result.output
    assert "--api-key-file" in result.output


def test_client_tls_options_are_checked_before_connecting(tmp_path):
    bad_ca = tmp_path / "ca.pem"
    bad_ca.write_text("not a certificate\n")
    result = runner.invoke(
        app, ["distributed", "client", "hello", "--address", "127.0.0.1:9", "--tls-ca", str(bad_ca)]
    )
    assert result.exit_code == 2
    assert f"the CA file '{bad_ca}' holds no PEM certificate" in result.output
