"""The damaged-champion drill through serving replicas: a champion whose weights were
scrambled where the replicas load them, rolled back by the first ``collect`` after the
collapse, with no request failing in the replicas meanwhile (issue 38's target).

Run alone, from the repository root, after ``bash scripts/main.sh`` (its workspace holds
the registry, the head its drill damaged and the champion it displaced)::

    python -m benchmarks.drill_replicas --work .specops/demo --out measurements/drill-replicas.json

1. ``--replicas`` ``specops serve`` processes start, following the hardware target's
   champion in the workspace's registry (polling every ``--poll-s``) and capturing every
   request into the workspace's store; traffic (HumanEval prompts, one client per replica) runs
   from here to the end, every response kept: its status, the draft that served it and
   what it accepted.
2. The main job's drill draft is downloaded where the replicas load drafts from and its
   weights scrambled there (:func:`tasks.loop.damage.scramble_weights`: it loads and
   drafts, wrongly); its rollback hold from the main job is cleared, as an operator does
   with ``specops registry clear-rollback``, and it is promoted by hand.
3. Once every replica serves it and the store holds ``watch.newest`` of its requests, one
   ``collect`` (the flow, in-process, without versioning or retraining) runs the watch.
4. Traffic goes on until every replica serves the champion restored, plus a round.

The report (``--out``, JSON): requests sent and failed (a non-2xx answer or a transport
error) in each phase, when each replica swapped to the damaged draft and back, the watch's
verdict, and the acceptance served in each phase.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from serving.atomic import write_json_atomic
from serving.errors import BadInputError, SpecOpsError
from serving.hardware import DEFAULT_HARDWARE

PHASES = ("before", "damaged", "restored")


@dataclass
class Answer:
    replica: int
    sent_s: float  # since the study started
    seconds: float
    status: int | None  # None: a transport error
    error: str | None
    draft: str | None
    draft_tokens: int
    accepted_tokens: int
    phase: str = ""


class Traffic:
    """One client thread per replica, sending HumanEval prompts in turn until stopped."""

    def __init__(self, urls: list[str], prompts: list[Any], max_tokens: int, started: float):
        self.urls, self.prompts, self.max_tokens, self.started = urls, prompts, max_tokens, started
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(urls))
        ]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=600)

    def _run(self, replica: int) -> None:
        import httpx

        from tasks.ops.team_loop import greedy_chat

        index = replica
        with httpx.Client(timeout=300.0) as client:
            while not self._stop.is_set():
                prompt = self.prompts[index % len(self.prompts)]
                index += len(self.urls)
                sent = time.perf_counter()
                status, error, body = None, None, {}
                try:
                    response = client.post(
                        f"{self.urls[replica]}/v1/chat/completions",
                        json=greedy_chat(prompt, self.max_tokens),
                    )
                    status = response.status_code
                    if response.is_success:
                        body = response.json()
                    else:
                        error = response.text[:200]
                except httpx.HTTPError as failure:
                    error = f"{type(failure).__name__}: {failure}"
                spec = (body.get("usage") or {}).get("speculative") or {}
                answer = Answer(
                    replica=replica,
                    sent_s=sent - self.started,
                    seconds=time.perf_counter() - sent,
                    status=status,
                    error=error,
                    draft=spec.get("draft_version"),
                    draft_tokens=int(spec.get("draft_tokens") or 0),
                    accepted_tokens=int(spec.get("accepted_tokens") or 0),
                )
                with self._lock:
                    self.answers.append(answer)

    def served(self, draft: str) -> int:
        with self._lock:
            return sum(1 for a in self.answers if a.draft == draft)


def _wait(what: str, done, timeout_s: float, every_s: float = 0.5) -> float:
    """Poll ``done()`` until true; the seconds it took, or an error naming ``what``."""
    start = time.perf_counter()
    while not done():
        if time.perf_counter() - start > timeout_s:
            raise SpecOpsError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)
    return time.perf_counter() - start


def _captured(store: Path, draft: str, since: float) -> int:
    """Records in ``store`` that ``draft`` served from Unix time ``since`` on (the replicas
    flush parts every 30 s at the latest)."""
    from serving.records.store import part_files

    count = 0
    for part in part_files(store):
        if part.stat().st_mtime < since:
            continue
        for line in part.read_text().splitlines():
            row = json.loads(line)
            if row.get("drafter_version") == draft and float(row.get("timestamp", 0)) >= since:
                count += 1
    return count


def _phase_summary(answers: list[Answer]) -> dict[str, Any]:
    drafted = sum(a.draft_tokens for a in answers)
    return {
        "requests": len(answers),
        "failed": sum(1 for a in answers if a.status is None or a.status >= 400),
        "errors": sorted({a.error for a in answers if a.error})[:5],
        "drafts": sorted({a.draft for a in answers if a.draft}),
        "acceptance": sum(a.accepted_tokens for a in answers) / drafted if drafted else None,
        "median_request_s": statistics.median(a.seconds for a in answers) if answers else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.demo_workspace import REPORT, open_workspace
    from flows.loop import collect
    from serving.hardware import hardware_target
    from serving.models.real import cache_root
    from serving.target import DEFAULT_TARGET
    from specops.prefect_env import prepare_prefect
    from tasks.data.traffic import build_workload
    from tasks.loop.damage import scramble_weights
    from tasks.loop.retrain_config import load_retrain_config
    from tasks.ops.server_process import ServerProcess
    from tasks.ops.team_loop import SwapWatch, replica_config, served_version

    work = Path(args.work)
    registry = open_workspace(work)
    if not REPORT.is_file():
        raise BadInputError(f"{REPORT} is missing: run `bash scripts/main.sh` first")
    drill = json.loads(REPORT.read_text()).get("drill") or {}
    if not drill.get("draft"):
        raise BadInputError(f"{REPORT} has no drill: run the main job with its drill")
    damaged, displaced = registry.resolve(drill["draft"]), registry.resolve(drill["displaced"])
    champion = registry.champion(args.hardware)
    if champion is None or champion.label != displaced.label:
        raise BadInputError(
            f"the champion of {args.hardware!r} is {champion.label if champion else None}, not "
            f"{displaced.label} (the main job's drill leaves it so): re-run the main job"
        )
    newest = load_retrain_config().watch.newest
    prepare_prefect()
    folder = work / "drill-replicas"
    folder.mkdir(parents=True, exist_ok=True)
    store = work / "store"  # the workspace's own: the collect validates what the replicas add
    replicas = []
    for i in range(args.replicas):
        config = replica_config(
            folder, f"r{i + 1}", target=DEFAULT_TARGET, hardware=hardware_target(args.hardware),
            poll_s=args.poll_s, store=store, max_tokens=args.max_new_tokens,
        )  # fmt: skip
        replicas.append(ServerProcess(["--config", str(config)], log_path=folder / f"r{i + 1}.log"))
    report: dict[str, Any] = {
        "work": str(work), "hardware": args.hardware, "replicas": args.replicas,
        "poll_s": args.poll_s, "max_new_tokens": args.max_new_tokens,
        "damaged": damaged.label, "displaced": displaced.label, "watch_newest": newest,
    }  # fmt: skip
    prompts = build_workload("humaneval", 40, seed=11, split="train")
    started = time.perf_counter()
    marks: dict[str, float] = {}
    try:
        for replica in replicas:  # one at a time: two model loads side by side thrash 2 cores
            replica.start()
        print(f"{len(replicas)} replicas serve {[served_version(r) for r in replicas]}")
        with (
            SwapWatch(replicas) as swaps,
            Traffic([r.url for r in replicas], prompts, args.max_new_tokens, started) as traffic,
        ):
            _wait("the first answers", lambda: len(traffic.answers) >= len(replicas), 300)
            package = registry.download(damaged, cache_root() / "registry")
            scrambled = scramble_weights(package)
            print(f"scrambled {len(scrambled)} file(s) of {damaged.label} in {package}")
            registry.clear_rollback(damaged, args.hardware)
            marks["promoted"] = time.perf_counter() - started
            promoted_at = time.time()
            registry.promote(damaged, args.hardware, reason="replica drill: to be damaged")
            print(f"promoted {damaged.label} by hand; waiting for the replicas to serve it")
            _wait(
                "every replica serving the damaged draft",
                lambda: all(served_version(r) == damaged.label for r in replicas),
                120,
            )
            marks["all_damaged"] = time.perf_counter() - started
            _wait(
                f"{newest} captured requests of {damaged.label}",
                lambda: _captured(store, damaged.label, promoted_at) >= newest,
                600,
                every_s=2.0,
            )
            marks["collect_started"] = time.perf_counter() - started
            print(f"{newest} of its requests captured; collect runs its watch")
            collected = collect(
                hardware=args.hardware, store=str(store), work=str(work), run_id="replica-drill",
                max_new_tokens=args.max_new_tokens, version=False, trigger_retrain=False,
                cooldown_minutes=0.0,
            )  # fmt: skip
            marks["collect_done"] = time.perf_counter() - started
            report["watch"] = collected.watch.model_dump() if collected.watch else None
            after = registry.champion(args.hardware)
            report["champion_after"] = after.label if after else None
            print(f"collect done: the champion is {report['champion_after']}")
            _wait(
                "every replica serving the restored champion",
                lambda: all(served_version(r) == displaced.label for r in replicas),
                120,
            )
            marks["all_restored"] = time.perf_counter() - started
            served = traffic.served(displaced.label)
            more = served + 2 * len(replicas)
            _wait("a round on the restored champion",
                  lambda: traffic.served(displaced.label) >= more, 300)  # fmt: skip
        marks["stopped"] = time.perf_counter() - started
        # (seconds since the study started, replica, the draft it serves from then on)
        offset = time.time() - time.perf_counter() + started
        report["swaps"] = [(at - offset, index, version) for at, index, version in swaps.changes]
    finally:
        for replica in replicas:
            replica.stop()
    answers = list(traffic.answers)
    # The damage lasted from the promotion until every replica served the restored
    # champion again (the watch moves the alias early in the collect; the replicas follow
    # within a poll): the first moment after the promotion when all of them did.
    back: dict[int, float] = {}
    for seconds, index, version in report["swaps"]:
        if version == displaced.label and seconds > marks["all_damaged"]:
            back.setdefault(index, seconds)
    if len(back) == len(replicas):
        marks["all_restored"] = max(back.values())
    for answer in answers:
        answer.phase = (
            "before" if answer.sent_s < marks["promoted"]
            else "damaged" if answer.sent_s < marks["all_restored"]
            else "restored"
        )  # fmt: skip
    report["damage_lasted_s"] = marks["all_restored"] - marks["all_damaged"]
    report["marks_s"] = marks
    report["phases"] = {p: _phase_summary([a for a in answers if a.phase == p]) for p in PHASES}
    report["failed"] = sum(report["phases"][p]["failed"] for p in PHASES)
    report["restored"] = report["champion_after"] == displaced.label
    report["answers"] = [asdict(a) for a in answers]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=".specops/demo", help="the main job's workspace")
    parser.add_argument("--hardware", default=DEFAULT_HARDWARE)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--poll-s", type=float, default=1.0, help="the replicas' champion poll")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", default="results/drill-replicas.json")
    args = parser.parse_args(argv)
    if args.replicas < 1:
        raise SystemExit(f"--replicas must be at least 1, not {args.replicas}")
    report = run(args)
    write_json_atomic(Path(args.out), report)
    phases = report["phases"]
    print(
        f"restored: {report['restored']}; failed requests: {report['failed']} of "
        f"{sum(p['requests'] for p in phases.values())}; acceptance before / damaged / "
        f"restored: {[phases[p]['acceptance'] for p in PHASES]}; written {args.out}"
    )
    return 0 if report["restored"] and report["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
