"""Run a GPU run kit's steps on the machine it was copied to (``run.sh`` calls this).

    python -m tasks.gpu.there KIT {measure|learn|all|STEP} --out RESULTS

Each step runs in its own process (:mod:`tasks.gpu.steps`), killed past the least of its
limit, what is left of this command's ten minutes and what is left of the kit's GPU
budget; its log goes to ``RESULTS/logs/STEP.log`` and its outcome to ``RESULTS/steps.json``
(rewritten after every step, so an interrupted run says how far it got). A failed step is
recorded and the next still runs. Standard library only until ``setup`` has installed the
kit's wheels.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from serving.errors import SpecOpsError
from tasks.gpu.manifest import read_manifest
from tasks.gpu.plan import steps_of

LEDGER = "steps.json"
MIN_STEP_S = 10  # less than this left: the step is skipped, not started


def _ledger(out: Path) -> dict:
    path = out / LEDGER
    return json.loads(path.read_text()) if path.is_file() else {"steps": {}}


def _save(out: Path, ledger: dict) -> None:
    scratch = out / f".{LEDGER}.tmp"
    scratch.write_text(json.dumps(ledger, indent=2) + "\n")
    os.replace(scratch, out / LEDGER)


def run(kit: Path, command: str, out: Path) -> int:
    manifest = read_manifest(kit)
    steps = steps_of(command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    ledger = _ledger(out)
    ledger.update(hardware=manifest.hardware, commit=manifest.commit)
    started = time.monotonic()
    failed = 0
    for step in steps:
        used = sum(s.get("seconds", 0.0) for s in ledger["steps"].values())
        left = min(
            step.limit_s,
            manifest.settings.command_s - (time.monotonic() - started),
            manifest.settings.total_s - used,
        )
        if left < MIN_STEP_S:
            ledger["steps"][step.name] = {
                "status": "skipped",
                "reason": f"{left:.0f} s of budget left",
                "seconds": 0.0,
            }
            _save(out, ledger)
            print(f"[{step.name}] skipped: the budget is spent", flush=True)
            failed += 1
            continue
        print(f"[{step.name}] {step.what} (limit {left:.0f} s)", flush=True)
        log = out / "logs" / f"{step.name}.log"
        began = time.monotonic()
        with log.open("w") as handle:
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "tasks.gpu.steps", step.name, str(kit), str(out)],
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    timeout=left,
                )
                status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
            except subprocess.TimeoutExpired:
                status = f"killed after {left:.0f} s"
        seconds = round(time.monotonic() - began, 1)
        ledger["steps"][step.name] = {"status": status, "seconds": seconds}
        _save(out, ledger)
        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
        print(f"[{step.name}] {status} in {seconds:.0f} s {tail[0] if tail else ''}", flush=True)
        failed += status != "ok"
    used = sum(s.get("seconds", 0.0) for s in ledger["steps"].values())
    print(
        f"{len(steps) - failed}/{len(steps)} step(s) ok; {used:.0f} s of the kit's "
        f"{manifest.settings.total_s} s used; results in {out}"
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kit", type=Path)
    parser.add_argument("command", help="measure, learn, all, or one step's name")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        return run(args.kit.resolve(), args.command, args.out.resolve())
    except SpecOpsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
