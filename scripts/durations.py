"""Turn pytest's timings into the committed report docs/test-durations.md.

    python scripts/durations.py .reports/pytest.xml > docs/test-durations.md
    python scripts/durations.py run.log --slowest 50        # `pytest --durations=0` output

Each input is a JUnit XML file (``pytest --junitxml``) or the text of a run with
``--durations=0``; several inputs (the main suite and the backend jobs) make one report.
A test's time is its setup, call and teardown together, so a module- or session-scoped
fixture counts once, in the first test that uses it. The report gives the runs' wall time,
the sum over tests per directory, and the slowest tests: where the suite's time goes.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `pytest --durations=0`: "12.34s call     tests/a/test_b.py::test_c[x]"
_DURATION_LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*)$")
_SUMMARY = re.compile(r"=+ .*\bin (\d+(?:\.\d+)?)s")


@dataclass(frozen=True)
class Run:
    """One pytest run: each test id's seconds, and the run's wall time when known."""

    source: str
    seconds: dict[str, float]
    wall_s: float | None
    outcomes: dict[str, int]


def _node_id(classname: str, name: str) -> str:
    """The test id behind JUnit's dotted ``classname``: the longest dotted prefix naming a
    file under the repository is the module, the rest are classes."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if (ROOT / path).is_file():
            return "::".join([path, *parts[end:], name])
    return f"{classname}::{name}"


def read_junit(path: Path) -> Run:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    seconds: dict[str, float] = {}
    outcomes: dict[str, int] = defaultdict(int)
    for case in root.iter("testcase"):
        test = _node_id(case.get("classname", ""), case.get("name", ""))
        seconds[test] = seconds.get(test, 0.0) + float(case.get("time") or 0.0)
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        outcomes[outcome] += 1
    wall = sum(float(s.get("time") or 0.0) for s in suites) if suites else None
    return Run(str(path), seconds, wall, dict(outcomes))


def read_durations(path: Path) -> Run:
    seconds: dict[str, float] = defaultdict(float)
    wall = None
    for line in path.read_text(errors="replace").splitlines():
        if match := _DURATION_LINE.match(line.strip()):
            seconds[match.group(3).strip()] += float(match.group(1))
        elif match := _SUMMARY.search(line):
            wall = float(match.group(1))
    if not seconds:
        raise SystemExit(f"{path}: no `--durations` lines (run pytest with --durations=0)")
    return Run(str(path), dict(seconds), wall, {})


def read_run(path: Path) -> Run:
    if not path.is_file():
        raise SystemExit(f"{path}: no such file")
    head = path.read_text(errors="replace")[:200].lstrip()
    return read_junit(path) if head.startswith("<") else read_durations(path)


def directory_of(test: str) -> str:
    return test.split("::", 1)[0].rsplit("/", 1)[0]


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s ({seconds / 60:.1f} min)"


def report(runs: list[Run], *, slowest: int = 30, title: str = "Test durations") -> str:
    seconds: dict[str, float] = {}
    for run in runs:
        for test, spent in run.seconds.items():
            seconds[test] = seconds.get(test, 0.0) + spent
    total = sum(seconds.values())
    lines = [
        f"# {title}",
        "",
        "Made by `python scripts/durations.py` from the runs below (docs/install.md, "
        '"Tests"); a test\'s time is its setup, call and teardown, so a shared fixture counts '
        "in the first test that uses it.",
        "",
        "| run | tests | outcomes | wall time |",
        "|---|---:|---|---:|",
    ]
    for run in runs:
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(run.outcomes.items())) or "-"
        wall = "-" if run.wall_s is None else _minutes(run.wall_s)
        lines.append(f"| `{run.source}` | {len(run.seconds)} | {outcomes} | {wall} |")
    lines += [
        "",
        f"Sum over all {len(seconds)} tests: {_minutes(total)}.",
        "",
        "## Per directory",
        "",
        "| directory | tests | seconds | share |",
        "|---|---:|---:|---:|",
    ]
    per_dir: dict[str, list[float]] = defaultdict(list)
    for test, spent in seconds.items():
        per_dir[directory_of(test)].append(spent)
    for folder, times in sorted(per_dir.items(), key=lambda item: -sum(item[1])):
        share = sum(times) / total if total else 0.0
        lines.append(f"| `{folder}` | {len(times)} | {sum(times):.1f} | {share:.0%} |")
    lines += [
        "",
        f"## The {min(slowest, len(seconds))} slowest tests",
        "",
        "| seconds | test |",
        "|---:|---|",
    ]
    for test, spent in sorted(seconds.items(), key=lambda item: -item[1])[:slowest]:
        lines.append(f"| {spent:.1f} | `{test}` |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="JUnit XML or --durations output")
    parser.add_argument("--slowest", type=int, default=30, help="how many slowest tests")
    parser.add_argument("--title", default="Test durations")
    parser.add_argument("--out", type=Path, help="write here (default: standard output)")
    args = parser.parse_args(argv)
    if args.slowest < 1:
        parser.error(f"--slowest must be at least 1, not {args.slowest}")
    text = report([read_run(p) for p in args.runs], slowest=args.slowest, title=args.title)
    if args.out is None:
        sys.stdout.write(text)
    else:
        from serving.atomic import write_text_atomic

        write_text_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
