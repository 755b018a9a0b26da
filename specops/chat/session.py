"""A chat session on one loaded target: answers, ``/compare``, ``/stats``, ``/champion``
and ``/save``. No terminal here: text arrives through callbacks, and a ``cancelled``
callable polled between tokens stops a generation (Ctrl-C is the terminal's business).

Each prompt is one single-turn chat (the user message through the chat template, no
earlier turns), so answers, comparisons and saved records do not depend on what was asked
before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from serving.engine.build import build_decoder
from serving.engine.decoder import Generation, SpeculativeDecoder
from serving.engine.metrics import pool, position_counts
from serving.engine.request import GenerationResult
from serving.engine.sampling import SamplingParams
from serving.errors import BadInputError, SpecOpsError
from serving.hardware import hardware_target
from serving.loader import encode_messages
from serving.server.text import TextAssembler
from serving.target import LoadedTarget
from specops.chat.commands import DRAFT_SETTINGS, Settings
from tasks.evaluate.interleave import interleave

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

OnText = Callable[[str, bool], None]  # (text, from_draft)
Cancelled = Callable[[], bool]
PLAIN = "plain"


class Interrupted(SpecOpsError):
    """A /compare stopped by the user (an answer stops with stop reason ``cancelled``)."""


@dataclass(frozen=True)
class Turn:
    """One answer: its prompt and text, the engine's result, and the draft that made it."""

    prompt: str
    text: str
    result: GenerationResult
    draft: str  # the draft's label, as /stats and the records name it


@dataclass(frozen=True)
class CompareRow:
    name: str  # "plain" or a drafter spec
    tokens: int  # per run (greedy: every run of a contender decodes the same tokens)
    tokens_per_s: float | None  # pooled over the rounds
    speedup: float | None  # over plain decoding's pooled tokens/s
    acceptance_rate: float | None
    mean_accepted_length: float | None
    matches_plain: bool  # every run's tokens equal plain decoding's, token for token


@dataclass(frozen=True)
class SessionStats:
    """The session's answers pooled (:func:`serving.engine.metrics.pool`) and acceptance by draft
    position: ``reached[i]`` target passes that checked a draft at position i, ``kept[i]``
    of them kept it."""

    pooled: dict[str, float | None]
    reached: list[int]
    kept: list[int]

    @property
    def acceptance_by_position(self) -> list[float | None]:
        return [k / r if r else None for k, r in zip(self.kept, self.reached, strict=True)]


@dataclass(frozen=True)
class SaveReport:
    store: Path
    parts: list[str]
    saved: int
    dropped: dict[str, int] = field(default_factory=dict)  # kind -> records redaction dropped


class ChatSession:
    """The loaded target (on its hardware target: its verify curve prices the policies,
    its name keys the records and the champion), the current settings and decoder, and
    every answer so far."""

    def __init__(self, target: LoadedTarget, *, settings: Settings | None = None) -> None:
        if target.tokenizer is None:
            raise BadInputError("a chat session needs the target's tokenizer")
        self.target = target
        self.tokenizer: PreTrainedTokenizerBase = target.tokenizer
        self.settings = (settings or Settings()).check()
        self.decoder = self._decoder(self.settings)
        self.draft = self._label(self.settings)
        self.turns: list[Turn] = []
        self._saved = 0  # turns[:_saved] were offered to /save already

    # --- settings ------------------------------------------------------------------------

    def _decoder(self, settings: Settings) -> SpeculativeDecoder:
        return build_decoder(self.target, settings.plan)

    @staticmethod
    def _label(settings: Settings) -> str:
        if settings.drafter == "none":
            return "none (plain decoding)"
        return f"{settings.drafter} ({settings.policy}, k={settings.k})"

    def set(self, key: str, value: object) -> None:
        """Change one setting; the draft is rebuilt first, so a draft that fails to build
        (a missing file, another vocabulary) leaves the session as it was."""
        settings = self.settings.with_value(key, value)
        if any(getattr(settings, k) != getattr(self.settings, k) for k in DRAFT_SETTINGS):
            self.decoder = self._decoder(settings)
            self.draft = self._label(settings)
        self.settings = settings

    def use_champion(self, hardware: str | None, cache: Path) -> str:
        """Draft with the registry's champion of hardware target ``hardware`` (default:
        this session's): its package's drafter, policy and k. :class:`SpecOpsError` (no
        champion, no registry) leaves the session as it was."""
        from serving.server.champion import RegistryChampion

        name = hardware or self.target.name
        champion = RegistryChampion(hardware_target(name), cache=cache).current()
        plan = champion.plan  # the package's, its paths resolved
        spec = str(plan.drafter)
        settings = (
            self.settings.with_value("drafter", spec)
            .with_value("policy", plan.policy)
            .with_value("k", plan.k)
        )
        label = f"{champion.version}, champion of {name}: {spec} ({plan.policy}, k={plan.k})"
        self.decoder = self._decoder(settings)  # always: a new champion may reuse the spec
        self.settings, self.draft = settings, label
        return label

    # --- answers -------------------------------------------------------------------------

    def encode(self, prompt: str) -> list[int]:
        return encode_messages(self.tokenizer, [{"role": "user", "content": prompt}])

    def ask(
        self, prompt: str, *, on_text: OnText | None = None, cancelled: Cancelled | None = None
    ) -> Turn:
        """Answer ``prompt`` with the current settings, streaming text with provenance; a
        ``cancelled()`` that turns true stops the answer (stop reason ``cancelled``)."""
        settings = self.settings
        sampling = SamplingParams(temperature=settings.temperature)
        generation = self.decoder.stream(
            self.encode(prompt),
            max_new_tokens=settings.max_tokens,
            sampling=sampling,
            mode=settings.mode,
        )
        text = _stream(generation, self.tokenizer, on_text, cancelled)
        assert generation.result is not None
        turn = Turn(prompt=prompt, text=text, result=generation.result, draft=self.draft)
        self.turns.append(turn)
        return turn

    @property
    def last_prompt(self) -> str | None:
        return self.turns[-1].prompt if self.turns else None

    # --- /compare --------------------------------------------------------------------------

    def compare(
        self,
        specs: Sequence[str],
        prompt: str | None = None,
        *,
        rounds: int = 2,
        cancelled: Cancelled | None = None,
        on_run: Callable[[str, int], None] | None = None,
    ) -> list[CompareRow]:
        """``prompt`` (default: the last one) through plain decoding and each drafter in
        ``specs`` (default: the session's), greedy and in fast mode, ``rounds`` rounds in
        alternating order (:func:`tasks.evaluate.interleave.interleave`, so that neither warm
        caches nor a noisy neighbour favour whoever runs first). ``on_run(name, round)`` is
        called before each run."""
        prompt = prompt or self.last_prompt
        if prompt is None:
            raise BadInputError(
                "nothing to compare yet: type a prompt first, or /compare SPEC -- PROMPT"
            )
        if rounds < 1:
            raise BadInputError(f"rounds must be >= 1, got {rounds}")
        names = [PLAIN, *[s for s in (specs or [self.settings.drafter]) if s != "none"]]
        decoders = {}
        for name in names:
            spec = "none" if name == PLAIN else name
            decoders[name] = self._decoder(self.settings.with_value("drafter", spec))
        ids = self.encode(prompt)

        def call(decoder: SpeculativeDecoder) -> Callable[[int], GenerationResult]:
            def run(_round: int) -> GenerationResult:
                generation = decoder.stream(
                    ids, max_new_tokens=self.settings.max_tokens, mode="fast"
                )
                _stream(generation, self.tokenizer, None, cancelled)
                result = generation.result
                assert result is not None
                if result.stop_reason == "cancelled":
                    raise Interrupted("/compare interrupted")
                return result

            return run

        runs: dict[str, list[GenerationResult]] = {name: [] for name in names}
        calls = {name: call(decoders[name]) for name in names}
        for timed in interleave(calls, rounds, order="alternate", on_start=on_run):
            for name, run in timed.items():
                runs[name].append(run.value)
        return compare_rows(runs)

    # --- /stats --------------------------------------------------------------------------

    def stats(self) -> SessionStats:
        return session_stats([t.result for t in self.turns])

    # --- /save ---------------------------------------------------------------------------

    @property
    def unsaved(self) -> list[Turn]:
        """Answers since the last /save that have a record (detailed mode, not interrupted)."""
        return [t for t in self.turns[self._saved :] if keeps_record(t)]

    def save(self, store: Path) -> SaveReport:
        """Append the unsaved records to ``store`` as new atomic parts, redacted as the
        server's capture redacts (:class:`serving.server.capture.Capture`: workload
        ``live``, split ``train``); a part that cannot be written raises
        :class:`SpecOpsError` and its records stay unsaved."""
        from serving.security.redact import Redactor
        from serving.server.capture import Capture

        pending, upto = self.unsaved, len(self.turns)
        if not pending:
            return SaveReport(store=store, parts=[], saved=0)
        capture = Capture(
            root=store,
            share=1.0,
            hardware=self.target.hardware,
            chunk_size=len(pending) + 1,  # one flush, below
            replica="chat",
            redactor=Redactor(),
            tokenizer=self.tokenizer,
        )
        for turn in pending:
            assert turn.result.record is not None
            capture.add(
                turn.result.record,
                prompt_text=turn.prompt,
                output_text=turn.text,
                drafter_version=f"chat:{turn.draft}",
            )
        kept = len(pending) - sum(capture.dropped.values())
        written = capture.flush()
        if written < kept:
            raise SpecOpsError(
                f"could not write {kept - written} of {kept} records to {store} (see the log); "
                "they stay unsaved: /save again, or /save ANOTHER_STORE"
            )
        self._saved = upto
        return SaveReport(
            store=store, parts=list(capture.parts), saved=written, dropped=dict(capture.dropped)
        )


def keeps_record(turn: Turn) -> bool:
    return turn.result.record is not None and turn.result.stop_reason != "cancelled"


def _stream(
    generation: Generation,
    tokenizer: PreTrainedTokenizerBase,
    on_text: OnText | None,
    cancelled: Cancelled | None,
) -> str:
    """Run ``generation``, releasing text as it becomes final; returns the whole text."""
    assembler = TextAssembler(tokenizer)
    try:
        for event in generation:
            delta = assembler.add(event.token_id)
            if delta and on_text is not None:
                on_text(delta, event.from_draft)
            if cancelled is not None and cancelled():
                break
    finally:
        generation.close()  # a no-op once exhausted; else the result says "cancelled"
    tail = assembler.finish()
    if tail and on_text is not None:
        on_text(tail, False)
    return assembler.text


def compare_rows(runs: dict[str, list[GenerationResult]]) -> list[CompareRow]:
    """One row per contender, in order; ``runs[PLAIN]`` is the reference."""
    reference = runs[PLAIN][0].token_ids
    plain_speed = pool(r.stats for r in runs[PLAIN])["tokens_per_s"]
    rows = []
    for name, results in runs.items():
        pooled = pool(r.stats for r in results)
        speed = pooled["tokens_per_s"]
        rows.append(
            CompareRow(
                name=name,
                tokens=len(results[0].token_ids),
                tokens_per_s=speed,
                speedup=speed / plain_speed if speed and plain_speed else None,
                acceptance_rate=pooled["acceptance_rate"],
                mean_accepted_length=pooled["mean_accepted_length"],
                matches_plain=all(r.token_ids == reference for r in results),
            )
        )
    return rows


def session_stats(results: Sequence[GenerationResult]) -> SessionStats:
    reached: list[int] = []
    kept: list[int] = []
    for result in results:
        r, k = position_counts(result.steps)
        reached += [0] * (len(r) - len(reached))
        kept += [0] * (len(k) - len(kept))
        for i, (ri, ki) in enumerate(zip(r, k, strict=True)):
            reached[i] += ri
            kept[i] += ki
    return SessionStats(pooled=pool(r.stats for r in results), reached=reached, kept=kept)
