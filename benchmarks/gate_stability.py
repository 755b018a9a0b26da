"""Do the gates decide the same way on a quiet and on a busy machine?

The main job's last retrain evaluation, re-run on the same registered versions: its
champion and its timed challengers (``--challenger``; the learned drafts the pre-gate
refused are left out, as the retrain left them untimed), on the same prompts (the built-in
held-out prompts and the workspace's held-out traffic), ``--runs`` times alone and
``--runs`` times beside a CPU-bound process pinned to one core. Each run applies to the
same measurements the gates of ``configs/gates.yaml`` (modelled speed, priced with the
``--modelled-curve``, with the wall clock's interval), the same gates on the other curve,
and the wall-clock-only rule they replaced (measured speed over the timed rounds, the same
margins, no interval), and records which version each would promote.

Two settings reproduce earlier studies and are not the product's (docs/loop.md,
"Evaluation and gates"): ``--speed measured`` has the gates decide on measured speed (with
the interval) instead of modelled speed; ``--modelled-curve evaluated`` prices the modelled
speed with the curve the evaluation's own passes followed instead of the target's fixed
one.

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
from typing import TYPE_CHECKING, Any, Literal

from benchmarks.cli import run_study
from serving.atomic import write_json_atomic
from serving.hardware import DEFAULT_HARDWARE

if TYPE_CHECKING:
    from tasks.evaluate.gates import GateConfig
    from tasks.evaluate.modelled import Curve
    from tasks.evaluate.report import EvaluationReport

BURNER = "while True: pass"
Speed = Literal["modelled", "measured"]


def judged(
    report: EvaluationReport,
    config: GateConfig,
    speed: Speed = "modelled",
    curve: Curve = "profiled",
) -> EvaluationReport:
    """The report the gates judge in this study: as the product judges it (modelled speed on
    the target's fixed curve, or the config's ``speed_profile``), or, as earlier studies
    did, on measured ``speed`` (``report`` itself) or the evaluated ``curve``."""
    from tasks.evaluate.gates import judged_report
    from tasks.evaluate.modelled import modelled_report

    if config.speed_profile is not None or (speed == "modelled" and curve == "profiled"):
        return judged_report(report, config)
    return report if speed == "measured" else modelled_report(report, curve)


def winner(
    report: EvaluationReport,
    config: GateConfig,
    names: dict[str, str],
    *,
    speed: Speed = "modelled",
    curve: Curve = "profiled",
) -> tuple[str, dict[str, str]]:
    """The label the gates under ``config`` would leave as champion, and each verdict, with
    speed judged as :func:`judged` says."""
    from tasks.evaluate.gates import GateResult, gate

    report = judged(report, config, speed, curve)
    by_clock = speed == "measured" and config.speed_profile is None
    decided_by = "measured speed" if by_clock else config.decided_by
    verdicts, passing = {}, []
    for name, label in names.items():
        if name == "champion":
            continue
        result = gate(report, challenger=name, champion="champion", config=config)
        result = GateResult.of(result.checks, decided_by)
        verdicts[label] = result.reason
        if result.passed:
            passing.append(name)
    if not passing:
        return names["champion"], verdicts
    best = max(passing, key=lambda n: report.results[n].speedup or 0.0)
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
    parser.add_argument(
        "--speed",
        choices=["modelled", "measured"],
        default="modelled",
        help="the speed the gates decide on (the product's: modelled)",
    )
    parser.add_argument(
        "--modelled-curve",
        choices=["profiled", "evaluated"],
        default="profiled",
        help="the verify curve modelled speed is priced with (the product's: profiled, the "
        "target's fixed one; evaluated: the one the evaluation's own passes followed)",
    )
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
        wall_clock = config.model_copy(update={"wall_clock_confidence": 0.0})
        curve: Curve = args.modelled_curve
        other_curve: Curve = "profiled" if curve == "evaluated" else "evaluated"

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
                "speed": args.speed,
                "modelled_curve": curve,
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
                gated, verdicts = winner(report, config, names, speed=args.speed, curve=curve)
                clocked, clock_verdicts = winner(report, wall_clock, names, speed="measured")
                other, _ = winner(report, config, names, curve=other_curve)
                modelled = {
                    on: judged(report, config, curve=on).results for on in (curve, other_curve)
                }
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
                        on: {names[n]: r.speedup for n, r in results.items() if n in names}
                        for on, results in modelled.items()
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
