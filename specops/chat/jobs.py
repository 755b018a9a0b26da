"""``/eval`` and ``/train``: the loop's flows, run as ``specops`` subprocesses.

A flow is the same command a person would type (``specops data validate``, ``specops loop
run evaluate-and-promote``, ``specops loop run retrain``), run in a subprocess of its own
session (the terminal's Ctrl-C reaches the chat, which then stops the job) with the chat's
environment, so the registry the chat uses is the registry the flow uses. The session
keeps its target loaded and stays alive whatever the flow does: its output is read line
by line as progress, and a non-zero exit becomes one line with the reason (the command's
``error: ...`` line, else its last line).

What they run on, with the store the session saves to (``--store``):

- ``/eval [VERSION...]``: ``specops data validate`` builds WORK/dataset from the store, then
  ``evaluate-and-promote`` runs the champion and the VERSIONs (registered challengers) on
  humaneval's held-out prompts and the store's held-out traffic: the newest fifth of each
  workload's saved records (``params.yaml`` ``dataset.heldout_share``), so of this
  session's saved prompts the newest, which a retrain never trains on. A passing challenger
  is promoted.
- ``/train``: the retrain flow on the store: suffix, head and LoRA challengers from its
  trainable records (the rest of the saved prompts), registered, then evaluated and
  promoted as ``/eval`` does.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serving.defaults import DEFAULT_TARGET

# `HH:MM:SS.fff | LEVEL | message`: a Prefect log line, and its run's name.
_LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d+ \| (?P<level>[A-Z]+)\s*\| (?P<message>.*)$")
_RUN = re.compile(r"^(?:Flow|Task) run '(?P<name>[^']+)' - ")
STOP_WAIT_S = 10.0  # after Ctrl-C, how long a flow gets to stop before it is killed


@dataclass(frozen=True)
class Job:
    name: str  # "eval" or "train"
    commands: tuple[tuple[str, ...], ...]  # run in order; the first failure stops the job
    target: str = DEFAULT_TARGET  # the loop's target model (SPECOPS_TARGET): the session's


@dataclass(frozen=True)
class Progress:
    text: str
    transient: bool = False  # a progress bar's update: worth a status line, not a line of its own


@dataclass(frozen=True)
class JobOutcome:
    ok: bool
    reason: str  # a failure's one line; on success the last progress line
    seconds: float
    cancelled: bool = False


def specops_command(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "specops", *args)


def eval_job(
    *, target: str, hardware: str, store: str, work: str, challengers: Sequence[str] = ()
) -> Job:
    dataset = f"{work}/dataset"
    versions = [part for version in challengers for part in ("--challenger", version)]
    return Job(
        "eval",
        (
            specops_command("data", "validate", "--store", store, "--out", dataset),
            specops_command(
                "loop",
                "run",
                "evaluate-and-promote",
                "--hardware",
                hardware,
                "--store",
                store,
                "--work",
                work,
                *versions,
            ),
        ),
        target,
    )


def train_job(*, target: str, hardware: str, store: str, work: str) -> Job:
    return Job(
        "train",
        (
            specops_command(
                "loop", "run", "retrain", "--hardware", hardware, "--store", store, "--work", work
            ),
        ),
        target,
    )


def progress_line(line: str) -> Progress | None:
    """What of a flow's output line is progress: a log line's message (its level unless
    INFO; a run's name shortened), a progress bar's state, a command's own summary;
    ``None`` for tracebacks and the final JSON."""
    text = line.rstrip()
    match = _LOG_LINE.match(text)
    if match:
        message = _RUN.sub(r"\g<name>: ", match["message"])
        level = match["level"]
        return Progress(message if level == "INFO" else f"{level.lower()}: {message}")
    if not text.strip() or text[0] in ' {}[]"' or text.startswith(("Traceback", "See https://")):
        return None
    if re.match(r"^[\w.]+(Error|Exception)\b", text):  # a traceback's last line
        return None
    return Progress(text, transient="%|" in text)


def failure_reason(lines: Sequence[str], returncode: int) -> str:
    """The command's ``error: ...`` line, else its last error log line, else its last
    progress line, else the exit code."""
    for line in reversed(lines):
        if line.startswith("error: "):
            return line.removeprefix("error: ").strip()
    shown = [p.text for p in (progress_line(line) for line in lines) if p and not p.transient]
    for text in reversed(shown):
        if text.startswith(("error: ", "critical: ")):
            return text.partition(": ")[2]
    return shown[-1] if shown else f"exited with code {returncode}"


def outcome_summary(shown: Sequence[str]) -> str:
    """A finished flow in one line: its champion decision, else its last line."""
    for text in reversed(shown):
        if "champion on " in text:
            return text
    return shown[-1] if shown else "done"


def run_job(
    job: Job,
    *,
    on_progress: Callable[[Progress], None],
    cancelled: Callable[[], bool],
    poll_s: float = 0.1,
) -> JobOutcome:
    """Run ``job``'s commands in order, calling ``on_progress`` with each progress line;
    stop (SIGINT, then SIGKILL after :data:`STOP_WAIT_S`) when ``cancelled()`` turns true."""
    started = time.monotonic()
    shown: list[str] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPECOPS_TARGET": job.target}
    for command in job.commands:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=env,
            start_new_session=True,  # the terminal's Ctrl-C is the chat's, not the flow's
        )
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_read, args=(process, lines), daemon=True).start()
        seen: list[str] = []
        while True:
            if cancelled():
                _stop(process)
                return JobOutcome(False, "cancelled", time.monotonic() - started, cancelled=True)
            try:
                line = lines.get(timeout=poll_s)
            except queue.Empty:
                continue
            if line is None:  # the output closed: the process is ending
                break
            seen.append(line)
            progress = progress_line(line)
            if progress is not None:
                if not progress.transient:
                    shown.append(progress.text)
                on_progress(progress)
        returncode = process.wait()
        if returncode != 0:
            return JobOutcome(False, failure_reason(seen, returncode), time.monotonic() - started)
    return JobOutcome(True, outcome_summary(shown), time.monotonic() - started)


def _read(process: subprocess.Popen, lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _stop(process: subprocess.Popen) -> None:
    """Interrupt the flow's process group (Prefect marks its run cancelled), then kill it."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        process.wait()
