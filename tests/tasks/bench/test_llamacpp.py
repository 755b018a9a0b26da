"""The llama.cpp baseline's process boundary: failures reported with stderr (fake
interpreters, no llama.cpp needed), and the JSON-lines protocol against a real llama.cpp
run when ``.venv-llamacpp`` exists."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from tasks.bench.llamacpp import (
    INSTALL,
    PYTHON_VARIABLE,
    LlamaCppError,
    LlamaCppProcess,
    LlamaCppUnavailable,
    llamacpp_python,
)

READY = '{"ready": true, "llama_cpp": "fake"}'


def _interpreter(tmp_path: Path, body: str) -> Path:
    """A stand-in for the environment's python: a shell script that ignores its arguments."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _start(python: Path, **kwargs) -> LlamaCppProcess:
    return LlamaCppProcess(Path("model.gguf"), threads=1, n_ctx=256, python=python, **kwargs)


def test_a_missing_environment_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv(PYTHON_VARIABLE, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(LlamaCppUnavailable, match="does not exist") as error:
        llamacpp_python()
    assert INSTALL in str(error.value)


def test_an_environment_without_llama_cpp_is_reported_with_the_import_error():
    # The main environment has no llama_cpp: the runner starts, fails to load, and says why.
    with pytest.raises(LlamaCppUnavailable, match="llama_cpp") as error:
        _start(Path(sys.executable))
    assert "build.log" in str(error.value)


def test_a_runner_that_dies_while_loading_is_reported_with_its_stderr(tmp_path):
    python = _interpreter(tmp_path, "echo 'illegal instruction' >&2\nexit 3\n")
    with pytest.raises(LlamaCppUnavailable, match=r"status 3(.|\n)*illegal instruction"):
        _start(python)


def test_a_runner_that_dies_mid_run_is_reported_with_its_stderr(tmp_path):
    python = _interpreter(tmp_path, f"echo '{READY}'\nread line\necho 'segfault' >&2\nexit 139\n")
    with _start(python) as process, pytest.raises(LlamaCppError, match=r"139(.|\n)*segfault"):
        process.generate([1, 2, 3], max_new_tokens=4)


def test_a_runner_that_hangs_is_stopped_not_waited_for(tmp_path):
    python = _interpreter(tmp_path, f"echo '{READY}'\nread line\nsleep 60\n")
    with (
        _start(python, request_timeout_s=0.5) as process,
        pytest.raises(LlamaCppError, match="did not answer a request within"),
    ):
        process.generate([1, 2, 3], max_new_tokens=4)


# --- A real llama.cpp run -----------------------------------------------------------------
def _real_python() -> Path | None:
    try:
        return llamacpp_python()
    except LlamaCppUnavailable:
        return None


needs_llamacpp = pytest.mark.skipif(
    _real_python() is None,
    reason=f"the llama.cpp environment is not installed ({INSTALL})",
)
# Token ids of the shipped SmolLM2 vocabulary: a chat header, then a repeated phrase, so
# that prompt lookup has something to draft.
HEADER = [1, 9690, 198, 2683, 359, 253, 5356, 30, 2, 198, 1, 4093, 198]
PHRASE = [504, 2365, 3582, 28]
PROMPT = [*HEADER, *PHRASE, *PHRASE, *PHRASE]


@pytest.fixture(scope="module")
def llama():
    from serving.models.real import gguf_path

    # One thread: llama.cpp's threads spin at every barrier, and on a busy 2-core machine a
    # second thread waiting for a descheduled one made 12 tokens take 45 s instead of 0.2 s.
    with LlamaCppProcess(gguf_path(), threads=1, n_ctx=256, prompt_lookup_tokens=(10,)) as process:
        yield process


@needs_llamacpp
def test_the_runner_reports_how_it_loaded(llama):
    assert llama.info["ready"] is True
    assert llama.info["llama_cpp"] == "0.3.36"
    assert llama.info["prompt_lookup_tokens"] == [10]


@needs_llamacpp
def test_greedy_decoding_is_repeatable_across_modes(llama):
    plain = llama.generate(PROMPT, max_new_tokens=12)
    assert 1 <= len(plain.token_ids) <= 12 and plain.seconds > 0
    assert plain.stop in ("eos", "length")
    lookup = llama.generate(PROMPT, max_new_tokens=12, mode="prompt_lookup", num_pred_tokens=10)
    # Prompt lookup reproduces plain decoding here, though not always: it verifies drafts
    # in batched passes, and llama.cpp's batched evaluation differs from its one-token one
    # (by up to 0.94 logits on these 12 positions; docs/quantised.md saw the two part on
    # longer outputs). It holds for this prompt because the first token comes from the same
    # prefill in both modes (identical logits), and every later greedy choice wins by at
    # least 1.12 logits while batching moved a margin by at most 0.23 (measured with
    # llama-cpp-python 0.3.36 on the shipped Q4_1 GGUF). The continuation repeats the
    # prompt's phrase, so lookup drafts and accepts: its batched passes are exercised.
    assert lookup.token_ids == plain.token_ids
    # No cache state leaks between requests or between the two models.
    again = llama.generate(PROMPT, max_new_tokens=12, mode="prompt_lookup", num_pred_tokens=10)
    assert again.token_ids == lookup.token_ids
    assert llama.generate(PROMPT, max_new_tokens=12).token_ids == plain.token_ids
    assert llama.generate(PROMPT[:-3], max_new_tokens=12).token_ids != []
    assert llama.generate(PROMPT, max_new_tokens=12).token_ids == plain.token_ids


@needs_llamacpp
def test_an_eos_id_ends_the_output_and_is_kept(llama):
    first = llama.generate(PROMPT, max_new_tokens=4).token_ids[0]
    out = llama.generate(PROMPT, max_new_tokens=4, eos=[first])
    assert out.token_ids == [first] and out.stop == "eos"


@needs_llamacpp
def test_a_bad_request_is_refused_and_the_runner_keeps_serving(llama):
    with pytest.raises(LlamaCppError, match="num_pred_tokens=3 was not loaded"):
        llama.generate(PROMPT, max_new_tokens=4, mode="prompt_lookup", num_pred_tokens=3)
    with pytest.raises(LlamaCppError, match="exceeds n_ctx=256"):
        llama.generate(PROMPT, max_new_tokens=250)
    assert len(llama.generate(PROMPT, max_new_tokens=3).token_ids) <= 3
