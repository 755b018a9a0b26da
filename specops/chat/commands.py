"""What a line typed into ``specops chat`` means, and the session's settings.

A line is a prompt, or a command that starts with ``/``. :func:`parse_line` turns it into
one of the small frozen types below, checking every value it can without a model (a drafter
spec, k, a policy, a temperature, a mode, a hardware target), so that bad input is one
:class:`~serving.errors.BadInputError` naming the value, and never reaches the model.
``//text`` sends ``/text`` as a prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from serving.engine.decoder import MODES
from serving.engine.drafters.factory import parse_drafter_spec
from serving.engine.drafters.kinds import KINDS, SPEC_SYNTAX, kind_of
from serving.engine.drafters.plan import DEFAULT_K, DEFAULT_POLICY, DraftPlan
from serving.engine.policy import MAX_DRAFT_TOKENS, POLICIES, check_k
from serving.errors import BadInputError
from serving.hardware import hardware_target


@dataclass(frozen=True)
class Settings:
    """How the next answer is decoded. ``drafter`` is a spec
    (``serving.engine.drafters.factory``)."""

    drafter: str = "pld"
    k: int = DEFAULT_K
    policy: str = DEFAULT_POLICY
    temperature: float = 0.0
    max_tokens: int = 256
    # detailed: every answer keeps its disagreement record, which /save, /eval and /train use.
    mode: str = "detailed"

    def check(self) -> Settings:
        """Every value checked (:class:`BadInputError` naming the first bad one)."""
        for key in ("drafter", "k", "policy", "temperature", "max_tokens", "mode"):
            check_setting(key, getattr(self, key))
        return self

    def with_value(self, key: str, value: object) -> Settings:
        checked: dict[str, Any] = {key: check_setting(key, value)}
        return replace(self, **checked)

    @property
    def plan(self) -> DraftPlan:
        """The draft plan of ``drafter``, ``policy`` and ``k``."""
        return DraftPlan.parse(self.drafter, policy=self.policy, k=self.k)


# The settings that change the draft (the decoder is rebuilt when one of them changes).
DRAFT_SETTINGS = ("drafter", "k", "policy")


def check_setting(key: str, value: object) -> object:
    """``value`` for setting ``key``, checked; :class:`BadInputError` naming it otherwise."""
    if key == "drafter":
        if not isinstance(value, str):
            raise BadInputError(f"a drafter is a spec such as 'ngram:4', got {value!r}")
        if value.strip() and kind_of(value) is None:  # the factory's message lists every syntax
            raise BadInputError(f"unknown drafter {value!r}; kinds: {', '.join(KINDS)} (/help)")
        parse_drafter_spec(value)
        return value.strip()
    if key == "k":
        return check_k(value)
    if key == "policy":
        if value not in POLICIES:
            raise BadInputError(f"unknown policy {value!r}; choose one of {', '.join(POLICIES)}")
        return value
    if key == "temperature":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadInputError(f"temperature must be a number, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise BadInputError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {value}"
            )
        return float(value)
    if key == "max_tokens":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadInputError(f"max tokens must be an integer >= 1, got {value!r}")
        return value
    if key == "mode":
        if value not in MODES:
            raise BadInputError(f"unknown mode {value!r}; choose one of {', '.join(MODES)}")
        return value
    raise BadInputError(f"unknown setting {key!r}")


# --- What a line means -----------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    text: str


@dataclass(frozen=True)
class Set:
    """Change one setting (already checked)."""

    key: str
    value: object


@dataclass(frozen=True)
class Compare:
    specs: tuple[str, ...]  # the drafters beside plain decoding (empty: the session's own)
    prompt: str | None  # None: the last prompt


@dataclass(frozen=True)
class ShowChampion:
    """``/champion [HW]``: show a hardware target's champion."""

    hardware: str | None  # None: the session's hardware target


@dataclass(frozen=True)
class Save:
    store: str | None  # None: the session's store


@dataclass(frozen=True)
class Eval:
    challengers: tuple[str, ...]  # registered versions, FAMILY/VERSION


@dataclass(frozen=True)
class Action:
    """A command without arguments: stats, train, help, quit."""

    name: str


Line = Prompt | Set | Compare | ShowChampion | Save | Eval | Action


@dataclass(frozen=True)
class CommandHelp:
    name: str
    usage: str
    summary: str


COMMANDS: tuple[CommandHelp, ...] = (
    CommandHelp(
        "drafter",
        "/drafter SPEC",
        f"draft with SPEC: {SPEC_SYNTAX}",
    ),
    CommandHelp("k", "/k N", f"draft block 1..{MAX_DRAFT_TOKENS} (the cost policy's largest)"),
    CommandHelp("policy", "/policy NAME", f"draft-length policy: {' | '.join(POLICIES)}"),
    CommandHelp("temperature", "/temperature T", "0 = greedy (the target's own greedy answer)"),
    CommandHelp("max-tokens", "/max-tokens N", "token budget of an answer"),
    CommandHelp(
        "mode",
        "/mode fast|detailed",
        "detailed keeps each answer's record for /save, /eval and /train",
    ),
    CommandHelp(
        "compare",
        "/compare [SPEC...] [-- PROMPT]",
        "the last prompt (or PROMPT) through plain decoding and each SPEC: greedy, interleaved",
    ),
    CommandHelp("stats", "/stats", "this session's pooled statistics and acceptance by position"),
    CommandHelp(
        "champion", "/champion [HARDWARE]", "draft with the registry's champion of HARDWARE"
    ),
    CommandHelp("save", "/save [STORE]", "append the records not saved yet to the store, one part"),
    CommandHelp(
        "eval",
        "/eval [VERSION...]",
        "/save, then evaluate-and-promote: the champion and VERSIONs on the store's held-out "
        "traffic and humaneval",
    ),
    CommandHelp(
        "train", "/train", "/save, then the retrain flow on the store (train, evaluate, promote)"
    ),
    CommandHelp("help", "/help", "this help"),
    CommandHelp("quit", "/quit", "leave the session (Ctrl-D too)"),
)
NAMES = tuple(c.name for c in COMMANDS)
ALIASES = {"exit": "quit", "q": "quit", "?": "help", "max_tokens": "max-tokens"}


def unknown_command(name: str) -> str:
    listed = " ".join(f"/{n}" for n in NAMES)
    return f"unknown command /{name}; commands: {listed} (/help)"


def _usage(name: str) -> str:
    return next(c.usage for c in COMMANDS if c.name == name)


def _one(name: str, args: list[str]) -> str:
    if len(args) != 1:
        what = "one value" if args else "a value"
        raise BadInputError(f"/{name} takes {what}: {_usage(name)}")
    return args[0]


def _integer(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadInputError(f"/{name}: {text!r} is not an integer ({_usage(name)})") from None


def parse_line(line: str) -> Line | None:
    """The meaning of ``line`` (``None`` for a blank line); :class:`BadInputError` with one
    line naming the bad command or value."""
    text = line.strip()
    if not text:
        return None
    if text.startswith("//"):
        return Prompt(text[1:])
    if not text.startswith("/"):
        return Prompt(text)
    head, _, rest = text[1:].partition(" ")
    name = ALIASES.get(head.lower(), head.lower())
    args = rest.split()
    if name not in NAMES:
        raise BadInputError(unknown_command(head))
    if name == "drafter":
        if not args:
            raise BadInputError(f"/drafter takes a spec: {_usage(name)}, e.g. /drafter ngram:4")
        return Set("drafter", check_setting("drafter", " ".join(args)))
    if name == "k":
        return Set("k", check_setting("k", _integer(name, _one(name, args))))
    if name == "max-tokens":
        return Set("max_tokens", check_setting("max_tokens", _integer(name, _one(name, args))))
    if name == "policy":
        return Set("policy", check_setting("policy", _one(name, args).lower()))
    if name == "mode":
        return Set("mode", check_setting("mode", _one(name, args).lower()))
    if name == "temperature":
        value = _one(name, args)
        try:
            number = float(value)
        except ValueError:
            raise BadInputError(
                f"/temperature: {value!r} is not a number ({_usage(name)})"
            ) from None
        return Set("temperature", check_setting("temperature", number))
    if name == "compare":
        return _compare(rest)
    if name == "champion":
        if len(args) > 1:
            raise BadInputError(f"/champion takes at most one hardware target: {_usage(name)}")
        if args:
            hardware_target(args[0])
        return ShowChampion(args[0] if args else None)
    if name == "save":
        if len(args) > 1:
            raise BadInputError(f"/save takes at most one store folder: {_usage(name)}")
        return Save(args[0] if args else None)
    if name == "eval":
        return Eval(tuple(args))
    if args:
        raise BadInputError(f"/{name} takes no argument, got {rest.strip()!r}")
    return Action(name)


def _compare(rest: str) -> Compare:
    specs_text, dashes, prompt = rest.partition("--")
    if dashes and not prompt.strip():
        raise BadInputError("/compare ... -- PROMPT: the prompt after -- is empty")
    specs: list[str] = []
    for spec in specs_text.split():
        check_setting("drafter", spec)
        if spec.lower() != "none" and spec not in specs:
            specs.append(spec)
    return Compare(tuple(specs), prompt.strip() if dashes else None)
