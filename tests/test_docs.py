"""The documentation holds together: docs/ holds pages only (result files live in
measurements/), every relative link or image of a page resolves (its #anchor too, in a
page), and every results file a tracked text file names exists."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
MENTION = re.compile(
    r"(?<![\w./-])((?:docs|measurements|tests)/[A-Za-z0-9_./*-]+\.(?:jsonl|json|png|log|txt))"
)


def tracked(root: Path = ROOT) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [name for name in listed if (root / name).is_file()]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip())
    kept = "".join(
        c for c in text.lower() if c in " -" or unicodedata.category(c).startswith(("L", "N"))
    )
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#+\s+(.*)", line)
        if heading:
            name = slug(heading.group(1))
            count = seen.get(name, 0)
            seen[name] = count + 1
            found.add(name if count == 0 else f"{name}-{count}")
    return found


def broken_links(root: Path, files: list[str]) -> list[str]:
    bad = []
    for name in (f for f in files if f.endswith(".md")):
        page = root / name
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for match in LINK.finditer(text):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or (dest != root and root not in dest.parents):
                bad.append(f"{name}: broken link {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{name}: no anchor #{anchor} in {dest.relative_to(root)}")
    return bad


def missing_mentions(root: Path, files: list[str]) -> list[str]:
    bad = []
    for name in files:
        try:
            text = (root / name).read_text()
        except (UnicodeDecodeError, OSError):
            continue  # a binary file
        for match in MENTION.finditer(text):
            mentioned = match.group(1)
            if not any(fnmatch.fnmatchcase(f, mentioned) for f in files):
                bad.append(f"{name}: names a missing file {mentioned}")
    return bad


def test_docs_holds_pages_only():
    others = [f for f in tracked() if f.startswith("docs/") and not f.endswith(".md")]
    assert not others, f"result files belong in measurements/, not docs/: {others}"


def test_every_link_of_every_page_resolves():
    assert not broken_links(ROOT, tracked())


def test_every_results_file_named_exists():
    assert not missing_mentions(ROOT, tracked())


def test_the_checks_see_a_broken_link_and_a_missing_file(tmp_path):
    (tmp_path / "docs").mkdir()
    gone = "/".join(("docs", "result.json"))  # spelt apart: this file names no real one
    page = "# Title\n\n[ok](#title) [gone](other.md) [no anchor](#nothing)\n"
    (tmp_path / "docs" / "page.md").write_text(f"{page}from {gone}\n")
    files = ["docs/page.md"]
    assert broken_links(tmp_path, files) == [
        "docs/page.md: broken link other.md",
        "docs/page.md: no anchor #nothing in docs/page.md",
    ]
    assert missing_mentions(tmp_path, files) == [f"docs/page.md: names a missing file {gone}"]
