"""The terminal side of ``specops chat``: reading lines, printing answers and tables, and
Ctrl-C.

Lines are read with prompt_toolkit (history in a file, Tab completion of commands and
drafter specs) when stdin and stdout are a terminal, and plainly otherwise (piped input
is echoed, so a scripted session prints as a transcript). Output goes through rich:
text from accepted drafts in :data:`DRAFT_STYLE`, tables for ``/compare`` and ``/stats``.

Ctrl-C at the prompt clears the line; while the session works (an answer, a comparison, a
flow) the first Ctrl-C asks the work to stop at its next token or line (:class:`CtrlC`)
and the session returns to the prompt; a second one interrupts at once. Whatever goes
wrong in a command is one red line, and the session goes on.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from serving.engine.drafters.kinds import DRAFTER_KINDS, PATH_KINDS, split_spec
from serving.errors import BadInputError, SpecOpsError
from specops.chat.commands import (
    COMMANDS,
    Action,
    Compare,
    Eval,
    Line,
    Prompt,
    Save,
    Set,
    ShowChampion,
    parse_line,
)
from specops.chat.jobs import Job, Progress, eval_job, run_job, train_job
from specops.chat.session import ChatSession, CompareRow, Interrupted, SessionStats, Turn

DRAFT_STYLE = "bold green"  # text whose tokens the target accepted from the draft
BAR_WIDTH = 20
ReadLine = Callable[[str], str]


class CtrlC:
    """SIGINT while the session works: the first asks the work to stop (the work polls
    this object), a second raises :class:`KeyboardInterrupt` at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None

    def __enter__(self) -> CtrlC:
        self.requested = False
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __call__(self) -> bool:
        return self.requested


def _ratio(value: float | None, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def _elapsed(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def status_line(turn: Turn) -> str:
    """One line after an answer: its tokens, speed, acceptance and the draft that ran."""
    stats = turn.result.stats
    parts = [
        f"{stats.generated_tokens} tokens in {stats.checks} passes",
        f"{_ratio(stats.tokens_per_s, '.1f')} tok/s",
        f"acceptance {_ratio(stats.acceptance_rate)}",
        f"mean accepted length {_ratio(stats.mean_accepted_length)}",
        turn.draft,
    ]
    stops = {"cancelled": "interrupted", "length": "hit max tokens"}
    if turn.result.stop_reason in stops:
        parts.append(stops[turn.result.stop_reason])
    return " · ".join(parts)


def prompt_label(spec: str) -> str:
    """The draft in the prompt: its spec, a folder or file shortened to its last part."""
    kind, arg = split_spec(spec)
    return f"{kind}:{Path(arg).name}" if kind in PATH_KINDS and arg else spec


def compare_table(rows: list[CompareRow], *, prompt: str, rounds: int) -> Table:
    shown = prompt if len(prompt) <= 40 else prompt[:37] + "..."
    table = Table(
        caption=f"greedy, {rounds} interleaved rounds; prompt: {shown}", caption_justify="left"
    )
    for header in ("drafter", "tokens", "tok/s", "speedup", "acceptance", "mean acc. len"):
        table.add_column(header, justify="left" if header == "drafter" else "right")
    table.add_column("matches plain")
    for row in rows:
        table.add_row(
            row.name,
            str(row.tokens),
            _ratio(row.tokens_per_s, ".1f"),
            "—" if row.speedup is None else f"{row.speedup:.2f}x",
            _ratio(row.acceptance_rate),
            _ratio(row.mean_accepted_length),
            "yes" if row.matches_plain else "[bold red]NO[/]",
        )
    return table


def stats_tables(stats: SessionStats) -> list[Table]:
    pooled = stats.pooled
    summary = Table()
    summary.add_column("answers")
    summary.add_column("value", justify="right")
    for label, key, spec in (
        ("requests", "requests", "d"),
        ("tokens", "generated_tokens", "d"),
        ("target passes", "checks", "d"),
        ("draft tokens", "draft_tokens", "d"),
        ("accepted", "accepted_tokens", "d"),
        ("acceptance rate", "acceptance_rate", ".3f"),
        ("mean accepted length", "mean_accepted_length", ".2f"),
        ("tokens/s", "tokens_per_s", ".1f"),
    ):
        summary.add_row(label, _ratio(pooled[key], spec))
    tables = [summary]
    if stats.reached:
        positions = Table()
        for header in ("draft position", "drafted", "accepted", "rate"):
            positions.add_column(header, justify="right")
        positions.add_column("")
        for index, (rate, reached, kept) in enumerate(
            zip(stats.acceptance_by_position, stats.reached, stats.kept, strict=True)
        ):
            bar = "" if rate is None else "█" * round(rate * BAR_WIDTH)
            positions.add_row(str(index + 1), str(reached), str(kept), _ratio(rate), bar)
        tables.append(positions)
    return tables


def help_table() -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column("usage", style="bold")
    table.add_column("what it does")
    for command in COMMANDS:
        table.add_row(command.usage, command.summary)
    return table


HELP_NOTES = (
    "Anything else is a prompt: one single-turn chat message (earlier turns are not sent).",
    f"[{DRAFT_STYLE}]Text like this[/] came from draft tokens the target accepted.",
    "Keys: Ctrl-C stops an answer, /compare or a flow (at the prompt: clears the line); "
    "Ctrl-D or /quit leaves; Up/Down walk the history; Tab completes.",
)


def line_reader(console: Console, history: Path | None, hardware_names: list[str]) -> ReadLine:
    """prompt_toolkit on a terminal; otherwise lines from stdin, echoed."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        if history is not None:
            history.parent.mkdir(parents=True, exist_ok=True)
        prompt_session: PromptSession[str] = PromptSession(
            history=FileHistory(str(history)) if history is not None else InMemoryHistory(),
            completer=completer(hardware_names),
        )
        return prompt_session.prompt

    def read(prompt: str) -> str:
        console.print(prompt, end="", markup=False, highlight=False)
        line = sys.stdin.readline()
        if not line:
            console.print()
            raise EOFError
        console.print(line.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
        return line

    return read


def completer(hardware_names: list[str]):
    """Tab completion: a command after ``/``, then its values (drafter specs, policies,
    modes, hardware targets)."""
    from prompt_toolkit.completion import Completer, Completion

    from serving.engine.decoder import MODES
    from serving.engine.policy import POLICIES

    specs = [spec for kind in DRAFTER_KINDS for spec in kind.completions]
    values: dict[str, list[str]] = {
        "/drafter": specs,
        "/compare": specs,
        "/policy": list(POLICIES),
        "/mode": list(MODES),
        "/champion": hardware_names,
    }
    commands = [f"/{c.name}" for c in COMMANDS]

    class ChatCompleter(Completer):
        def get_completions(self, document, complete_event):
            text = document.text_before_cursor.lstrip()
            head, space, _ = text.partition(" ")
            if not space:
                choices, word = (commands, text) if text.startswith("/") else ([], "")
            else:
                choices = values.get(head.lower(), [])
                word = document.get_word_before_cursor(WORD=True)
            for choice in choices:
                if choice.startswith(word) and choice != word:
                    yield Completion(choice, start_position=-len(word))

    return ChatCompleter()


class ChatUI:
    def __init__(
        self,
        session: ChatSession,
        *,
        console: Console,
        read_line: ReadLine,
        store: Path,
        work: Path,
        champion_cache: Path,
        target_name: str,
    ) -> None:
        self.session = session
        self.console = console
        self.read_line = read_line
        self.store = store
        self.work = work
        self.champion_cache = champion_cache
        self.target_name = target_name

    # --- output --------------------------------------------------------------------------

    def say(self, text: str, style: str | None = None) -> None:
        self.console.print(text, style=style, markup=False, highlight=False)

    def error(self, text: str) -> None:
        self.say(text, "red")

    def _text(self, text: str, from_draft: bool) -> None:
        self.console.print(
            text,
            style=DRAFT_STYLE if from_draft else None,
            end="",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        self.console.file.flush()

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        session = self.session
        self.say(
            f"specops chat · target {self.target_name} on {session.target.name} · draft "
            f"{session.draft} · /help lists the commands",
            "bold",
        )
        while True:
            try:
                line = self.read_line(f"{prompt_label(session.settings.drafter)} › ")
            except KeyboardInterrupt:
                continue  # Ctrl-C at the prompt: a fresh line
            except EOFError:
                break
            try:
                parsed = parse_line(line)
            except BadInputError as error:
                self.error(str(error))
                continue
            if parsed == Action("quit"):
                break
            if parsed is not None:
                self.handle(parsed)
        unsaved = len(session.unsaved)
        if unsaved:
            self.say(f"left with {unsaved} unsaved record(s) (/save keeps them)", "yellow")
        return 0

    def handle(self, line: Line) -> None:
        """Do one line; whatever fails is one red line and the session goes on."""
        try:
            self._dispatch(line)
        except KeyboardInterrupt:
            self.say("\ninterrupted", "yellow")
        except Interrupted as stopped:
            self.say(str(stopped), "yellow")
        except SpecOpsError as error:
            self.error(str(error))
        except Exception as error:  # a failing command must not end the session
            self.error(f"{type(error).__name__}: {error}")

    def _dispatch(self, line: Line) -> None:
        session = self.session
        match line:
            case Prompt(text):
                self.answer(text)
            case Set(key, value):
                session.set(key, value)
                shown = session.draft if key in ("drafter", "k", "policy") else value
                self.say(f"{key.replace('_', ' ')}: {shown}", "cyan")
            case Compare(specs, prompt):
                self.compare(specs, prompt)
            case ShowChampion(hardware):
                label = session.use_champion(hardware, self.champion_cache)
                self.say(f"draft: {label}", "cyan")
            case Save(store):
                self.save(Path(store) if store else self.store)
            case Eval(challengers):
                self.job(
                    eval_job(
                        target=self.target_name,
                        hardware=session.target.name,
                        store=str(self.store),
                        work=str(self.work),
                        challengers=challengers,
                    )
                )
            case Action("train"):
                self.job(
                    train_job(
                        target=self.target_name,
                        hardware=session.target.name,
                        store=str(self.store),
                        work=str(self.work),
                    )
                )
            case Action("stats"):
                self.stats()
            case Action("help"):
                self.console.print(help_table())
                for note in HELP_NOTES:
                    self.console.print(note, highlight=False)
            case _:
                raise BadInputError(f"nothing does {line!r}")

    # --- commands ------------------------------------------------------------------------

    def answer(self, prompt: str) -> None:
        with CtrlC() as ctrl_c:
            turn = self.session.ask(prompt, on_text=self._text, cancelled=ctrl_c)
        self.console.print()
        self.say(status_line(turn), "dim")

    def compare(self, specs: tuple[str, ...], prompt: str | None) -> None:
        rounds = 2
        with CtrlC() as ctrl_c, self.console.status("/compare") as status:

            def on_run(name: str, round_index: int) -> None:
                status.update(f"/compare: round {round_index + 1} of {rounds}, {name}")

            rows = self.session.compare(
                specs, prompt, rounds=rounds, cancelled=ctrl_c, on_run=on_run
            )
        shown = prompt or self.session.last_prompt or ""
        self.console.print(compare_table(rows, prompt=shown, rounds=rounds))

    def stats(self) -> None:
        stats = self.session.stats()
        if not stats.pooled["requests"]:
            self.say("no answers yet: type a prompt", "yellow")
            return
        self.say(f"this session's {stats.pooled['requests']} answers, pooled", "bold")
        for table in stats_tables(stats):
            self.console.print(table)

    def save(self, store: Path) -> None:
        report = self.session.save(store)
        if not report.parts:
            reason = (
                "answers in /mode fast keep no record"
                if self.session.turns and self.session.settings.mode == "fast"
                else "no new answers since the last /save"
            )
            self.say(f"nothing to save ({reason})", "yellow")
            return
        self.say(f"saved {report.saved} record(s) to {store}:", "green")
        for part in report.parts:
            self.say(f"  {part}")
        for kind, count in report.dropped.items():
            self.say(f"  {count} record(s) not saved: redaction dropped them ({kind})", "yellow")

    def job(self, job: Job) -> None:
        """Save what is unsaved, then run ``job`` with its progress; Ctrl-C stops it."""
        from serving.records.store import part_files

        if self.session.unsaved:
            self.save(self.store)
        if not part_files(self.store):
            raise BadInputError(
                f"the store {self.store} has no records: answer some prompts in /mode detailed "
                f"first (/{job.name} saves them before it starts)"
            )
        for command in job.commands:
            self.say("running: specops " + " ".join(command[3:]), "dim")
        started = time.monotonic()
        with CtrlC() as ctrl_c, self.console.status(f"/{job.name}") as status:

            def on_progress(progress: Progress) -> None:
                if not progress.transient:
                    self.say(f"  {progress.text}", "dim")
                spent = _elapsed(time.monotonic() - started)
                status.update(f"/{job.name} {spent} · {progress.text[:70]}")

            outcome = run_job(job, on_progress=on_progress, cancelled=ctrl_c)
        spent = _elapsed(outcome.seconds)
        if outcome.cancelled:
            self.say(f"/{job.name} stopped after {spent}", "yellow")
        elif outcome.ok:
            self.say(f"/{job.name} finished in {spent}: {outcome.reason}", "green")
        else:
            self.error(f"/{job.name} failed after {spent}: {outcome.reason}")
