"""A terminal for tests: a command in a pseudo-terminal (pexpect) whose output is drawn
on an emulated screen (pyte), which also answers the program's cursor-position requests
as a real terminal does. Tests type into it and read the screen, colours included."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

import pexpect
import pyte


class _Screen(pyte.Screen):
    def __init__(self, columns: int, lines: int, reply: Callable[[str], None]) -> None:
        super().__init__(columns, lines)
        self._reply = reply

    def write_process_input(self, data: str) -> None:  # e.g. a cursor position report
        self._reply(data)


class Terminal:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str,
        rows: int = 200,
        columns: int = 150,
        timeout_s: float = 60.0,
    ) -> None:
        # Rows enough that nothing scrolls off during a test: the whole session stays on screen.
        self.child = pexpect.spawn(
            argv[0], list(argv[1:]), env=env, cwd=cwd, dimensions=(rows, columns), echo=False
        )
        self.screen = _Screen(columns, rows, self.child.send)
        self.stream = pyte.ByteStream(self.screen)
        self.timeout_s = timeout_s

    def pump(self, wait_s: float = 0.05) -> bool:
        """Draw whatever the program wrote; False once it has exited."""
        try:
            self.stream.feed(self.child.read_nonblocking(65536, timeout=wait_s))
        except pexpect.TIMEOUT:
            pass
        except pexpect.EOF:
            return False
        return True

    @property
    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display).rstrip()

    def wait_for(self, pattern: str, *, after: int = 0, timeout_s: float | None = None) -> int:
        """Wait until ``pattern`` (a regex) is on screen past character ``after``; return the
        position just past the match."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        regex = re.compile(pattern)
        while True:
            match = regex.search(self.text, after)
            if match:
                return match.end()
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on screen after {after}:\n{self.text}")
            if not self.pump():
                match = regex.search(self.text, after)
                if match:
                    return match.end()
                raise AssertionError(f"exited before {pattern!r} showed:\n{self.text}")

    def type(self, line: str) -> None:
        self.child.send(line + "\r")

    def chars(self, row: int) -> list[pyte.screens.Char]:
        line = self.screen.buffer[row]
        return [line[x] for x in range(self.screen.columns)]

    def rows_with(self, fragment: str) -> list[int]:
        return [i for i, line in enumerate(self.screen.display) if fragment in line]

    def wait_exit(self, timeout_s: float = 30.0) -> int | None:
        """The program's exit status, once it has exited."""
        deadline = time.monotonic() + timeout_s
        while self.pump():
            if time.monotonic() > deadline:
                raise AssertionError(f"still running after {timeout_s} s:\n{self.text}")
        self.child.close()
        return self.child.exitstatus

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
