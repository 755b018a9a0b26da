"""``specops deploy vllm`` and ``deploy cycle`` where vLLM is not installed (this suite's
environment; ``$SPECOPS_VLLM_PYTHON`` points at a missing interpreter so that the outcome
does not depend on a ``.venv-vllm`` beside the checkout): one line naming the install
command, exit 2, and nothing registered, promoted or started. Their argument checks too."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from specops.cli import app

runner = CliRunner()
INSTALL = "install it with: bash scripts/setup_backend.sh vllm"


@pytest.fixture
def no_vllm(tmp_path, monkeypatch):
    missing = tmp_path / "no-vllm" / "bin" / "python"
    monkeypatch.setenv("SPECOPS_VLLM_PYTHON", str(missing))
    return missing


def _refused(result, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output


def _nothing_registered() -> None:
    from registry.client import Registry

    assert Registry().families() == []


# --- deploy vllm ----------------------------------------------------------------------------
def test_vllm_without_the_environment_names_its_install_command(no_vllm, registry_env, tmp_path):
    args = ["deploy", "vllm", "--hardware", "cpu-vllm", "--work", str(tmp_path / "work")]
    result = runner.invoke(app, args)
    _refused(result, f"{str(no_vllm)!r} does not exist; {INSTALL}")
    assert not (tmp_path / "work").exists()  # nothing started


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--hardware", "cpu"], "hardware target 'cpu' runs on 'transformers', not vLLM"),
        (["--hardware", "cuda-vllm"], "'cuda-vllm' (vllm on cuda) cannot run on this machine"),
        (["--hardware", "tpu"], "unknown hardware target 'tpu'"),
        (["--hardware", "cpu-vllm", "--host", "0.0.0.0"], "refusing to bind '0.0.0.0'"),
        (["--hardware", "cpu-vllm", "--tls-cert", "cert.pem"], "tls_cert and tls_key go together"),
        (
            ["--hardware", "cpu-vllm", "--tls-cert", "/no/cert.pem", "--tls-key", "/no/key.pem"],
            "cannot read the TLS key '/no/key.pem'",
        ),
        (["--port", "8100"], "Missing option '--hardware'"),
    ],
)
def test_vllm_checks_its_arguments_first(no_vllm, args, fragment):
    _refused(runner.invoke(app, ["deploy", "vllm", *args]), fragment)


def test_vllm_open_beyond_loopback_only_when_asked(no_vllm):
    """--allow-unauthenticated lets the bind check pass; the missing vLLM ends it next."""
    args = ["deploy", "vllm", "--hardware", "cpu-vllm", "--host", "0.0.0.0"]
    _refused(runner.invoke(app, [*args, "--allow-unauthenticated"]), INSTALL)


# --- deploy cycle ---------------------------------------------------------------------------
def _cycle(tmp_path, *args: str):
    work = ["--work", str(tmp_path / "work"), "--store", str(tmp_path / "capture")]
    return runner.invoke(app, ["deploy", "cycle", *work, "--out", str(tmp_path / "r.json"), *args])


def test_cycle_without_the_environment_registers_nothing(no_vllm, registry_env, tmp_path):
    _refused(_cycle(tmp_path), INSTALL)
    _nothing_registered()
    assert not (tmp_path / "r.json").exists()


def test_cycle_refuses_a_target_off_vllm_before_promoting_anything(registry_env, tmp_path):
    _refused(_cycle(tmp_path, "--hardware", "cpu"), "runs on 'transformers', not vLLM")
    _nothing_registered()


def test_cycle_refuses_a_bad_drafter_before_registering(registry_env, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_VLLM_PYTHON", sys.executable)  # "installed": past that check
    _refused(_cycle(tmp_path, "--second", "bogus"), "unknown drafter 'bogus'")
    _nothing_registered()
