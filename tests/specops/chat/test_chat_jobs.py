"""/eval and /train as subprocesses: their commands, progress lines, failures, Ctrl-C."""

from __future__ import annotations

import sys
import time

from specops.chat.jobs import (
    Job,
    Progress,
    eval_job,
    failure_reason,
    progress_line,
    run_job,
    train_job,
)


def test_the_flows_are_the_commands_a_person_would_type():
    job = eval_job(target="smollm2", hardware="cpu", store="st", work="wk", challengers=["head/3"])
    assert [c[3:] for c in job.commands] == [
        ("data", "validate", "--store", "st", "--out", "wk/dataset"),
        ("loop", "run", "evaluate-and-promote", "--hardware", "cpu", "--store", "st", "--work",
         "wk", "--challenger", "head/3"),
    ]  # fmt: skip
    assert all(c[:3] == (sys.executable, "-m", "specops") for c in job.commands)
    train = train_job(target="/models/t", hardware="cpu", store="st", work="wk")
    assert train.target == "/models/t"
    assert train.commands[0][3:] == (
        "loop", "run", "retrain", "--hardware", "cpu", "--store", "st", "--work", "wk"
    )  # fmt: skip


def test_progress_is_the_log_messages_not_the_tracebacks():
    assert progress_line(
        "10:42:27.642 | INFO    | Task run 'validate-85d' - Finished in state Completed()"
    ) == Progress("validate-85d: Finished in state Completed()")
    assert progress_line(
        "10:42:28.622 | ERROR   | Flow run 'wild-jackrabbit' - Encountered exception"
    ) == Progress("error: wild-jackrabbit: Encountered exception")
    assert progress_line("evaluating on cpu:  6%|▌  | 1/18 [00:46<13:12]") == Progress(
        "evaluating on cpu:  6%|▌  | 1/18 [00:46<13:12]", transient=True
    )
    for noise in (
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "serving.errors.BadInputError: no token sequences",
        '{"decision": 1}',
        "",
    ):
        assert progress_line(noise) is None


def test_the_reason_of_a_failure_is_its_error_line():
    lines = [
        "10:42:28.622 | ERROR   | Flow run 'w' - Encountered exception: X",
        "error: no token sequences to index",
        "10:42:29.000 | INFO    | prefect - Stopping temporary server",
    ]
    assert failure_reason(lines, 2) == "no token sequences to index"
    assert failure_reason(lines[:1], 1) == "w: Encountered exception: X"
    assert failure_reason([], 3) == "exited with code 3"


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_a_job_reports_progress_then_its_failure():
    job = Job(
        "train",
        (
            python("print('first step done')"),
            python("import sys; print('second step'); sys.exit('error: the store is empty')"),
            python("print('never runs')"),
        ),
    )
    seen: list[Progress] = []
    outcome = run_job(job, on_progress=seen.append, cancelled=lambda: False)
    assert not outcome.ok and not outcome.cancelled
    assert outcome.reason == "the store is empty"
    assert [p.text for p in seen] == [
        "first step done",
        "second step",
        "error: the store is empty",
    ]


def test_a_job_that_succeeds_says_its_champion_decision():
    job = Job("eval", (python("print('champion on cpu: ngram/2'); print('done')"),))
    outcome = run_job(job, on_progress=lambda p: None, cancelled=lambda: False)
    assert outcome.ok
    assert outcome.reason == "champion on cpu: ngram/2"


# A job started from a shell's background (`pytest ... &`) inherits SIGINT ignored, and would
# then stop only by SIGKILL after STOP_WAIT_S; the job here takes Ctrl-C as a flow does.
INTERRUPTIBLE = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "


def test_ctrl_c_stops_a_job():
    code = INTERRUPTIBLE + "import time; print('started', flush=True); time.sleep(60)"
    job = Job("train", (python(code),))
    seen: list[Progress] = []
    started = time.monotonic()
    outcome = run_job(job, on_progress=seen.append, cancelled=lambda: bool(seen))
    assert outcome.cancelled and not outcome.ok
    assert time.monotonic() - started < 30
