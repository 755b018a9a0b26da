"""What the pre-gate and early stopping save: a retrain's evaluation timed both ways.

The main job's last retrain evaluation, re-run on its registered versions (the champion,
the suffix draft and the two learned drafts that lose) and its prompts: once as the loop
runs it now (the pre-gate leaves a challenger predicted far below the champion untimed,
and a timed one whose wall-clock interval already excludes passing stops after a round),
once with every challenger timed for every round, as before the pre-gate. It reports each
run's seconds by phase and which contenders were timed. Run it alone, after
``bash scripts/main.sh``:
``python -m benchmarks.evaluation_time --work .specops/demo --threads 2 --out FILE.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.cli import run_study
from serving.atomic import write_json_atomic
from serving.hardware import DEFAULT_HARDWARE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(".specops/demo"))
    parser.add_argument("--hardware", default=DEFAULT_HARDWARE)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--prompts", type=int, default=4, help="built-in, per workload")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    def study() -> None:
        from benchmarks.demo_workspace import last_retrain_decision, open_workspace, retrain_prompts
        from serving.hardware import engine_target
        from serving.loader import set_threads
        from tasks.evaluate import gates as gate_config
        from tasks.evaluate.evaluate import Contender, evaluate_report
        from tasks.loop.targets import target_for

        registry = open_workspace(args.work)
        decision = last_retrain_decision()
        set_threads(args.threads)
        contenders = [
            Contender(name, registry.download(registry.resolve(label), args.work / "packages"))
            for name, label in decision["labels"].items()
        ]
        prompts = retrain_prompts(args.work, args.prompts)
        target = target_for(engine_target(args.hardware))
        config = gate_config.load_gates()
        runs: dict[str, dict] = {}
        seconds_of: dict[str, float] = {}
        for name, now in (("now", True), ("every contender timed", False)):
            started = time.perf_counter()
            report = evaluate_report(
                contenders,
                prompts,
                target=target,
                max_new_tokens=args.max_new_tokens,
                rounds=config.wall_clock_rounds,
                progress=True,
                pregate_margin=config.pregate_margin if now else None,
                stop_confidence=config.wall_clock_confidence if now else 0.0,
            )
            seconds_of[name] = time.perf_counter() - started
            runs[name] = {
                "seconds": round(seconds_of[name], 1),
                "phase_s": report.phase_s,
                "untimed": report.untimed,
                "stopped_early": list(report.stopped_early),
            }
            print(f"{name}: {seconds_of[name]:.0f} s ({report.phase_s}); "
                  f"untimed {sorted(report.untimed)}")  # fmt: skip
        result = {
            "hardware": args.hardware,
            "threads": args.threads,
            "labels": decision["labels"],
            "prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens,
            "rounds": config.wall_clock_rounds,
            "runs": runs,
            "ratio": seconds_of["now"] / seconds_of["every contender timed"],
        }
        write_json_atomic(args.out, result)
        print(f"now / every contender timed: {result['ratio']:.2f}")

    return run_study(study)


if __name__ == "__main__":
    sys.exit(main())
