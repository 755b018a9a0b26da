"""Check that no test went missing: the collected test ids hold every id of the committed
list tests/test-ids.txt, apart from the renames tests/test-renames.txt records.

    python scripts/check_test_ids.py                     # collects the suite itself
    python scripts/check_test_ids.py --ids ids.txt       # ids collected already
    python scripts/check_test_ids.py --write             # then make the list today's ids

scripts/test.sh passes the ids its pytest run collected (``--collected-ids``, a
tests/conftest.py option), so the suite is collected once. A renamed or moved test gets a
line ``old id -> new id`` in tests/test-renames.txt (``#`` starts a comment); a rename
whose new id is not collected fails too. ``--write`` (after a passing check) replaces the
list with the collected ids and empties the renames, so later changes are checked
against today's suite.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDS = ROOT / "tests" / "test-ids.txt"
RENAMES = ROOT / "tests" / "test-renames.txt"
RENAMES_HEADER = (
    "# Renamed or moved tests: `old id -> new id`, one a line (scripts/check_test_ids.py).\n"
)


def read_ids(path: Path) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines() if "::" in line}


def read_renames(path: Path) -> dict[str, str]:
    renames: dict[str, str] = {}
    if not path.is_file():
        return renames
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        old, arrow, new = line.partition(" -> ")
        if not arrow or "::" not in old or "::" not in new:
            raise SystemExit(f"{path}:{number}: {line!r} is not `old id -> new id`")
        renames[old.strip()] = new.strip()
    return renames


def collect() -> set[str]:
    """The suite's ids, as `pytest --collect-only -q` lists them (every test, skipped or not)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    ids = {line for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line}
    if done.returncode != 0 or not ids:
        tail = done.stdout[-3000:] + done.stderr[-3000:]
        raise SystemExit(f"collecting the tests failed:\n{tail}")
    return ids


def problems(expected: set[str], collected: set[str], renames: dict[str, str]) -> list[str]:
    found = []
    for old in sorted(expected - collected):
        new = renames.get(old)
        if new is None:
            found.append(f"missing: {old} (renamed? add `{old} -> NEW` to {RENAMES.name})")
        elif new not in collected:
            found.append(f"missing: {old}, renamed to {new}, which is not collected either")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=Path, help="collected ids, one a line (default: collect)")
    parser.add_argument("--expected", type=Path, default=IDS)
    parser.add_argument("--renames", type=Path, default=RENAMES)
    parser.add_argument("--write", action="store_true", help="then make the list these ids")
    args = parser.parse_args(argv)
    if args.ids is not None and not args.ids.is_file():
        parser.error(f"--ids {args.ids}: no such file")
    collected = read_ids(args.ids) if args.ids else collect()
    expected = read_ids(args.expected)
    found = problems(expected, collected, read_renames(args.renames))
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print(f"{len(found)} of {len(expected)} listed test ids are gone", file=sys.stderr)
        return 1
    print(f"test ids: {len(collected)} collected, all {len(expected)} listed ones kept")
    if args.write:
        from serving.atomic import write_text_atomic

        write_text_atomic(args.expected, "".join(f"{i}\n" for i in sorted(collected)))
        write_text_atomic(args.renames, RENAMES_HEADER)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
