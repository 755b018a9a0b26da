"""Do the gates decide the same way on a quiet and on a busy machine?

The main job's last retrain evaluation, re-run on the same registered versions: its
champion and its timed challengers (``--challenger``; the learned drafts the pre-gate
refused are left out, as the retrain left them untimed), on the same prompts (the built-in
held-out prompts and the workspace's held-out traffic), ``--runs`` times alone and
``--runs`` times beside a CPU-bound process pinned to one core. Each run applies the gates
as they are (modelled speed with the wall clock's interval, ``configs/gates.yaml``) and the
wall-clock-only rule they replaced (measured speed over the timed rounds, the same margins,
no interval) to the same measurements, and records which version each would promote.

Run it alone, after ``bash scripts/main.sh`` (its workspace holds the registry):
``python -m benchmarks.gate_stability --work .specops/demo --threads 2 --out FILE.json``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.cli import run_study
from serving.atomic import write_json_atomic
from serving.hardware import DEFAULT_HARDWARE

BURNER = "while True: pass"


def winner(report, config, names: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The label the gates under ``config`` would leave as champion, and each verdict."""
    from tasks.evaluate.gates import gate, judged_report

    judged = judged_report(report, config)
    verdicts, passing = {}, []
    for name, label in names.items():
        if name == "champion":
            continue
        result = gate(judged, challenger=name, champion="champion", config=config)
        verdicts[label] = result.reason
        if result.passed:
            passing.append(name)
    if not passing:
        return names["champion"], verdicts
    best = max(passing, key=lambda n: judged.results[n].speedup or 0.0)
    return names[best], verdicts


def _busy() -> subprocess.Popen:
    """A CPU-bound process on the last core."""
    core = max(os.sched_getaffinity(0))
    return subprocess.Popen(
        [sys.executable, "-c", BURNER], preexec_fn=lambda: os.sched_setaffinity(0, {core})
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(".specops/demo"))
    parser.add_argument("--hardware", default=DEFAULT_HARDWARE)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--runs", type=int, default=10, help="alone, and again busy")
    parser.add_argument("--prompts", type=int, default=4, help="built-in, per workload")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--champion", help="label (default: the last retrain's champion)")
    parser.add_argument("--challenger", action="append", default=None, help="label")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    def study() -> None:
        from benchmarks.demo_workspace import last_retrain_decision, open_workspace, retrain_prompts
        from serving.hardware import engine_target
        from serving.loader import set_threads
        from tasks.evaluate import gates as gate_config
        from tasks.evaluate.evaluate import Contender, evaluate_report
        from tasks.loop.steps import target_for

        registry = open_workspace(args.work)
        champion, challengers = args.champion, args.challenger
        if champion is None or challengers is None:
            decision = last_retrain_decision(", or name --champion and --challenger")
            labels, verdicts = decision["labels"], decision["gates"]
            champion = champion or labels["champion"]
            challengers = challengers or [
                label
                for name, label in labels.items()
                if name != "champion" and "pre-gate:" not in verdicts[label]["reason"]
            ]
        set_threads(args.threads)
        cache = args.work / "packages"
        names = {"champion": champion}
        contenders = [Contender("champion", registry.download(registry.resolve(champion), cache))]
        for index, label in enumerate(challengers):
            names[f"challenger-{index}"] = label
            contenders.append(
                Contender(f"challenger-{index}", registry.download(registry.resolve(label), cache))
            )
        prompts = retrain_prompts(args.work, args.prompts)
        target = target_for(engine_target(args.hardware))
        config = gate_config.load_gates()
        wall_clock = config.model_copy(update={"speed": "measured", "wall_clock_confidence": 0.0})
        other_curve = "profiled" if config.modelled_curve == "evaluated" else "evaluated"
        on_other_curve = config.model_copy(update={"modelled_curve": other_curve})

        def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
            gates_votes = Counter(r["promotes"] for r in runs)
            clock_votes = Counter(r["wall_clock_rule_promotes"] for r in runs)
            modal = gates_votes.most_common(1)[0][0]
            result = {
                "hardware": args.hardware,
                "threads": args.threads,
                "champion": champion,
                "challengers": challengers,
                "prompts": len(prompts),
                "max_new_tokens": args.max_new_tokens,
                "rounds": config.wall_clock_rounds,
                "gates_promote": dict(gates_votes),
                "modelled_curve": config.modelled_curve,
                f"gates_on_{other_curve}_curve_promote": dict(
                    Counter(r[f"{other_curve}_curve_promotes"] for r in runs)
                ),
                "wall_clock_rule_promotes": dict(clock_votes),
                "gates_agree": gates_votes[modal],
                "wall_clock_rule_agrees_with_gates": sum(
                    r["wall_clock_rule_promotes"] == r["promotes"] for r in runs
                ),
                "runs": runs,
            }
            write_json_atomic(args.out, result)
            return result

        runs: list[dict[str, Any]] = []
        for busy in (False, True):
            for index in range(args.runs):
                burner = _busy() if busy else None
                started = time.perf_counter()
                try:
                    report = evaluate_report(
                        contenders,
                        prompts,
                        target=target,
                        max_new_tokens=args.max_new_tokens,
                        rounds=config.wall_clock_rounds,
                        progress=False,
                    )
                finally:
                    if burner is not None:
                        burner.kill()
                        burner.wait()
                gated, verdicts = winner(report, config, names)
                clocked, clock_verdicts = winner(report, wall_clock, names)
                other, _ = winner(report, on_other_curve, names)
                judged = {
                    curve: gate_config.judged_report(report, settings).results
                    for curve, settings in (
                        (config.modelled_curve, config), (other_curve, on_other_curve)
                    )
                }  # fmt: skip
                row = {
                    "busy": busy,
                    "run": index,
                    "seconds": round(time.perf_counter() - started, 1),
                    "promotes": gated,
                    "wall_clock_rule_promotes": clocked,
                    f"{other_curve}_curve_promotes": other,
                    "measured_speedup": {
                        names[n]: r.speedup for n, r in report.results.items() if n in names
                    },
                    "modelled_speedup": {
                        curve: {names[n]: r.speedup for n, r in results.items() if n in names}
                        for curve, results in judged.items()
                    },
                    "evaluated_curve": report.evaluated_curve,
                    "verdicts": verdicts,
                    "wall_clock_verdicts": clock_verdicts,
                }
                runs.append(row)
                summarise(runs)  # after every run: an interrupted study keeps what it measured
                print(
                    f"{'busy ' if busy else 'alone'} {index + 1:>2}: gates promote {gated}; "
                    f"wall clock alone {clocked} ({row['seconds']} s)",
                    flush=True,
                )
        result = summarise(runs)
        print(
            f"gates: {result['gates_promote']}; the wall-clock-only rule: "
            f"{result['wall_clock_rule_promotes']} (agrees with the gates in "
            f"{result['wall_clock_rule_agrees_with_gates']} of {len(runs)})"
        )

    return run_study(study)


if __name__ == "__main__":
    sys.exit(main())
