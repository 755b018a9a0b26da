"""Which constrained-decoding library drives the skeleton? A measurement on this machine.

Each library in :data:`LIBRARIES` compiles the skeleton regex
(:meth:`serving.skeleton.grammar.SkeletonFormat.regex`) against the real tokenizer
(SmolLM2-135M-Instruct) and walks token by token along the encodings of a few valid
skeletons, each in a fresh spawned process so that memory and import cost are its own:

- ``tokenizer_s``: building the library's view of the tokenizer (once per tokenizer);
- ``compile_s``: compiling the grammar against it (once per grammar);
- ``first_mask_ms``: the first mask at the start state (lazy work a library defers);
- ``mask_us`` / ``advance_us``: mean time per token to produce the allowed-token mask as
  a bool tensor of the model's vocabulary size, and to advance the state by one token
  (without a cache on top: the library's own cost);
- ``copy_us``: copying a state mid-skeleton (what a speculative step does per draft);
- ``rss_mb``: peak resident memory that the tokenizer view, the compile and the walks
  added to a process that had already imported the library and loaded the tokenizer;
- ``checks``: correctness. ``valid``: every token of each valid skeleton allowed and the
  end finished (only EOS left); ``invalid``: each invalid text has a disallowed token or
  is not complete at its end; ``eos``: EOS allowed exactly where the text so far is a
  whole skeleton (checked on every step of every walk); ``extra_ids``: ids past the
  tokenizer (a padded model vocabulary, ``extra_ids`` of them) never allowed;
  ``random_walks``: walks that pick uniformly among the allowed non-EOS tokens until only
  EOS is left, each of which must decode to a text the regex matches, within
  :data:`MAX_WALK_TOKENS`.

A library that is not installed, or fails, is reported with the reason. The result is a
dict, also written atomically as JSON. Run it from the repository root as
``python -m benchmarks.constraint_compare --out results/constraint_compare.json``; its
result and the choice it made (llguidance) are in docs/skeleton.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import json
import multiprocessing
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from serving.atomic import write_json_atomic
from serving.skeleton.grammar import DEFAULT_FORMAT

# Distribution name -> module imported to use it.
LIBRARIES: dict[str, str] = {
    "outlines-core": "outlines_core",
    "xgrammar": "xgrammar",
    "llguidance": "llguidance",
    "lm-format-enforcer": "lmformatenforcer",
}

# The study's inputs, kept as they were when docs/skeleton.md's numbers were measured (and
# recorded in every report). The skeleton tests have their own, free to grow:
# tests/serving/skeleton/skeletons.py (a study imports nothing from tests/).
VALID_SKELETONS = (
    "[DIRECT]",
    "[PLAN]\n1. Gather the materials\n2. Cut the wood to size\n[END]",
    "[PLAN]\n1. Define the goal and the audience\n2. Research competitors\n"
    "3. Pick channels: email, social media, ads\n4. Set a budget\n"
    "5. Measure results (weekly)\n6. Adjust the plan\n[END]",
    "[PLAN]\n1. Café opening hours – check them\n2. Préparer le menu\n3. 准备材料\n[END]",
    "[PLAN]\n1. " + "x" * 80 + "\n2. A\n[END]",
)
INVALID_SKELETONS = (
    "[PLAN]\n1. Only one point\n[END]",
    "[PLAN]\n1. First\n3. Third\n[END]",
    "[PLAN]\n" + "".join(f"{i}. Point\n" for i in range(1, 8)) + "[END]",
    "[PLAN]\n1. Has [bracket]\n2. Second\n[END]",
    "[PLAN]\n1. " + "x" * 81 + "\n2. A\n[END]",
    "[PLAN]\n1. \n2. Empty title\n[END]",
    "[PLAN]\n1.  Leading space\n2. Second\n[END]",
    "[PLAN]\n1. Trailing space \n2. Second\n[END]",
    "[PLAN]\n1. Tab\there\n2. Second\n[END]",
    "[PLAN]\n1. First\n2. Second\n[END]\n",
    "[direct]",
    "[DIRECT] and more",
    "Sure! [DIRECT]",
)
MAX_WALK_TOKENS = 1000


class _Matcher(Protocol):
    """One library behind the same four calls. ``advance`` may mutate and return ``state``."""

    def start(self) -> Any: ...
    def mask(self, state: Any) -> torch.Tensor: ...  # bool [vocab_size]
    def advance(self, state: Any, token: int) -> Any: ...  # raises ValueError if refused
    def copy(self, state: Any) -> Any: ...


def _unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [ceil(vocab / 32)] with bit ``i % 32`` of word ``i // 32`` set where ``i`` is
    allowed -> bool [vocab_size]. numpy, not torch: a torch elementwise op on a busy
    two-core machine waits milliseconds for its thread pool."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")
    return torch.from_numpy(bits[:vocab_size].astype(bool))


def _ids_mask(ids: Any, vocab_size: int) -> torch.Tensor:
    """bool [vocab_size], True at ``ids``."""
    allowed = np.zeros(vocab_size, dtype=bool)
    allowed[np.asarray(ids, dtype=np.int64)] = True
    return torch.from_numpy(allowed)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the character a byte-level BPE vocabulary
    writes for each byte -> that byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    shift = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shift)
            shift += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _token_bytes(tokenizer: Any) -> dict[int, bytes]:
    """The bytes of every regular (not special) token of a byte-level BPE tokenizer."""
    decoder = _byte_decoder()
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    return {
        token_id: bytes(decoder[c] for c in piece)
        for piece, token_id in tokenizer.get_vocab().items()
        if token_id not in special
    }


# ---------------------------------------------------------------------- the adapters


class _OutlinesCore:
    """A compiled DFA over tokens (``Index``); a state is an int, so copying is free."""

    def __init__(self, tokenizer: Any, vocab_size: int, regex: str, timings: dict) -> None:
        from outlines_core import Index, Vocabulary

        started = time.perf_counter()
        by_bytes: dict[bytes, list[int]] = {}
        for token_id, piece in _token_bytes(tokenizer).items():
            by_bytes.setdefault(piece, []).append(token_id)
        vocabulary = Vocabulary(tokenizer.eos_token_id, by_bytes)
        timings["tokenizer_s"] = time.perf_counter() - started
        started = time.perf_counter()
        self.index = Index(regex, vocabulary)
        timings["compile_s"] = time.perf_counter() - started
        self.vocab_size = vocab_size

    def start(self) -> int:
        return int(self.index.get_initial_state())

    def mask(self, state: int) -> torch.Tensor:
        return _ids_mask(self.index.get_allowed_tokens(state), self.vocab_size)

    def advance(self, state: int, token: int) -> int:
        following = self.index.get_next_state(state, token)
        if following is None:
            raise ValueError(f"token {token} refused")
        return int(following)

    def copy(self, state: int) -> int:
        return state


class _Xgrammar:
    """A pushdown matcher with an adaptive token-mask cache; ``fork`` copies it."""

    def __init__(self, tokenizer: Any, vocab_size: int, regex: str, timings: dict) -> None:
        import xgrammar

        self.xgrammar = xgrammar
        started = time.perf_counter()
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=[tokenizer.eos_token_id]
        )
        timings["tokenizer_s"] = time.perf_counter() - started
        started = time.perf_counter()
        compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.compiled = compiler.compile_regex(regex)
        timings["compile_s"] = time.perf_counter() - started
        self.vocab_size = vocab_size
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)

    def start(self) -> Any:
        return self.xgrammar.GrammarMatcher(self.compiled)

    def mask(self, state: Any) -> torch.Tensor:
        state.fill_next_token_bitmask(self.bitmask)
        return _unpack_bitmask(self.bitmask[0], self.vocab_size)

    def advance(self, state: Any, token: int) -> Any:
        if not state.accept_token(token):
            raise ValueError(f"token {token} refused")
        return state

    def copy(self, state: Any) -> Any:
        return state.fork()


class _Llguidance:
    """An Earley parser over a derivative-based lexer, masks computed lazily per step;
    ``deep_copy`` and ``rollback`` copy or rewind it."""

    def __init__(self, tokenizer: Any, vocab_size: int, regex: str, timings: dict) -> None:
        import llguidance
        import llguidance.hf

        self.llguidance = llguidance
        started = time.perf_counter()
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        timings["tokenizer_s"] = time.perf_counter() - started
        started = time.perf_counter()
        self.grammar = llguidance.LLMatcher.grammar_from_regex(regex)
        matcher = llguidance.LLMatcher(self.tokenizer, self.grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        timings["compile_s"] = time.perf_counter() - started
        self.vocab_size = vocab_size

    def start(self) -> Any:
        return self.llguidance.LLMatcher(self.tokenizer, self.grammar, log_level=0)

    def mask(self, state: Any) -> torch.Tensor:
        bias = np.frombuffer(state.compute_logit_bias(), dtype=np.uint8)
        return torch.from_numpy(bias[: self.vocab_size] > 0)

    def advance(self, state: Any, token: int) -> Any:
        if not state.consume_token(token):
            raise ValueError(f"token {token} refused: {state.get_error()}")
        return state

    def copy(self, state: Any) -> Any:
        return state.deep_copy()


class _LmFormatEnforcer:
    """A character-level parser walked over a prefix tree of the token strings; a state is
    the token prefix (the enforcer caches by prefix). Its transformers integration does not
    import under transformers 5, so the tokenizer data is built here the way it builds it."""

    def __init__(self, tokenizer: Any, vocab_size: int, regex: str, timings: dict) -> None:
        from lmformatenforcer import RegexParser, TokenEnforcer
        from lmformatenforcer.tokenenforcer import TokenEnforcerTokenizerData

        started = time.perf_counter()
        token_zero = tokenizer.encode("0", add_special_tokens=False)[-1]
        special = set(tokenizer.all_special_ids)
        regular = []
        for token_id in range(len(tokenizer)):
            if token_id in special:
                continue
            after_zero = tokenizer.decode([token_zero, token_id])[1:]
            alone = tokenizer.decode([token_id])
            regular.append((token_id, after_zero, len(after_zero) > len(alone)))

        def decode(tokens: list[int]) -> str:
            return str(tokenizer.decode(tokens)).rstrip("\ufffd")

        data = TokenEnforcerTokenizerData(
            regular, decode, tokenizer.eos_token_id, False, vocab_size
        )
        timings["tokenizer_s"] = time.perf_counter() - started
        started = time.perf_counter()
        self.enforcer = TokenEnforcer(data, RegexParser(regex))
        timings["compile_s"] = time.perf_counter() - started
        self.vocab_size = vocab_size

    def start(self) -> tuple[int, ...]:
        return ()

    def mask(self, state: tuple[int, ...]) -> torch.Tensor:
        tokens = self.enforcer.get_allowed_tokens(list(state))
        return _ids_mask(list(getattr(tokens, "allowed_tokens", tokens)), self.vocab_size)

    def advance(self, state: tuple[int, ...], token: int) -> tuple[int, ...]:
        if not bool(self.mask(state)[token]):
            raise ValueError(f"token {token} refused")
        return (*state, token)

    def copy(self, state: tuple[int, ...]) -> tuple[int, ...]:
        return state


_ADAPTERS: dict[str, Callable[..., _Matcher]] = {
    "outlines-core": _OutlinesCore,
    "xgrammar": _Xgrammar,
    "llguidance": _Llguidance,
    "lm-format-enforcer": _LmFormatEnforcer,
}


# ----------------------------------------------------------------------- measurement


def _status_mb(field: str) -> float:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def _walk(
    matcher: _Matcher, tokens: list[int], eos: int, text_of: Callable[[list[int]], str]
) -> tuple[bool, list[str], list[float], list[float]]:
    """Walk ``tokens``; (accepted, problems, mask seconds, advance seconds)."""
    regex = re.compile(DEFAULT_FORMAT.regex())
    problems: list[str] = []
    mask_s: list[float] = []
    advance_s: list[float] = []
    state = matcher.start()
    for position, token in enumerate(tokens):
        started = time.perf_counter()
        allowed = matcher.mask(state)
        mask_s.append(time.perf_counter() - started)
        if bool(allowed[eos]) != bool(regex.fullmatch(text_of(tokens[:position]))):
            problems.append(f"EOS allowed={bool(allowed[eos])} after {position} tokens")
        if not bool(allowed[token]):
            return False, problems, mask_s, advance_s
        started = time.perf_counter()
        try:
            state = matcher.advance(state, token)
        except ValueError:
            problems.append(f"token {token} in the mask but refused by advance")
            return False, problems, mask_s, advance_s
        advance_s.append(time.perf_counter() - started)
    final = matcher.mask(state)
    finished = bool(final[eos]) and int(final.sum()) == 1
    return finished, problems, mask_s, advance_s


def _random_walk(
    matcher: _Matcher, eos: int, rng: random.Random, text_of: Callable[[list[int]], str]
) -> tuple[str, list[str]]:
    regex = re.compile(DEFAULT_FORMAT.regex())
    state = matcher.start()
    tokens: list[int] = []
    problems: list[str] = []
    for _ in range(MAX_WALK_TOKENS):
        allowed = matcher.mask(state)
        if bool(allowed[eos]) != bool(regex.fullmatch(text_of(tokens))):
            problems.append(f"EOS allowed={bool(allowed[eos])} after {text_of(tokens)!r}")
        allowed[eos] = False
        choices = allowed.nonzero().flatten().tolist()
        if not choices:
            break
        token = rng.choice(choices)
        state = matcher.advance(state, token)
        tokens.append(token)
    else:
        problems.append(f"not finished after {MAX_WALK_TOKENS} tokens")
    text = text_of(tokens)
    if not regex.fullmatch(text):
        problems.append(f"random walk ended in a text the grammar refuses: {text!r}")
    return text, problems


def measure_library(
    name: str, *, random_walks: int = 10, extra_ids: int = 64, seed: int = 0
) -> dict[str, Any]:
    """Measure one library in this process (call it in a fresh one); a dict of results."""
    from transformers import AutoConfig, AutoTokenizer

    from serving.models.real import real_model_dir

    torch.set_num_threads(1)  # masks are small; a thread pool only adds wake-up latency
    model_dir = real_model_dir(progress=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab_size = max(AutoConfig.from_pretrained(model_dir).vocab_size, len(tokenizer)) + extra_ids
    eos = int(tokenizer.eos_token_id)

    def text_of(tokens: list[int]) -> str:
        return str(tokenizer.decode(tokens, skip_special_tokens=False))

    base_mb = _status_mb("VmRSS")
    _reset_peak_rss()
    result: dict[str, Any] = {"version": importlib.metadata.version(name)}
    timings: dict[str, float] = {}
    matcher = _ADAPTERS[name](tokenizer, vocab_size, DEFAULT_FORMAT.regex(), timings)
    result.update(timings)
    started = time.perf_counter()
    first = matcher.mask(matcher.start())
    result["first_mask_ms"] = (time.perf_counter() - started) * 1e3

    problems: list[str] = []
    mask_s: list[float] = []
    advance_s: list[float] = []
    accepted = 0
    for text in VALID_SKELETONS:
        tokens = tokenizer.encode(text, add_special_tokens=False)
        ok, walk_problems, masks, advances = _walk(matcher, tokens, eos, text_of)
        accepted += ok
        problems += walk_problems
        mask_s += masks
        advance_s += advances
        if not ok:
            problems.append(f"valid skeleton refused: {text!r}")
    rejected = 0
    for text in INVALID_SKELETONS:
        tokens = tokenizer.encode(text, add_special_tokens=False)
        ok, walk_problems, _, _ = _walk(matcher, tokens, eos, text_of)
        rejected += not ok
        problems += walk_problems
        if ok:
            problems.append(f"invalid skeleton accepted: {text!r}")
    state = matcher.start()
    for token in tokenizer.encode(VALID_SKELETONS[2], add_special_tokens=False)[:20]:
        state = matcher.advance(state, token)
    started = time.perf_counter()
    for _ in range(100):
        matcher.copy(state)
    copy_us = (time.perf_counter() - started) / 100 * 1e6
    extra_ok = not bool(first[len(tokenizer) :].any())
    rng = random.Random(seed)
    walks_ok = 0
    walk_lengths = []
    for _ in range(random_walks):
        text, walk_problems = _random_walk(matcher, eos, rng, text_of)
        walks_ok += not walk_problems
        walk_lengths.append(len(text))
        problems += walk_problems
    result.update(
        mask_us=statistics.mean(mask_s) * 1e6,
        mask_us_max=max(mask_s) * 1e6,
        advance_us=statistics.mean(advance_s) * 1e6,
        copy_us=copy_us,
        steps_timed=len(mask_s),
        rss_mb=_status_mb("VmHWM") - base_mb,
        checks={
            "valid": f"{accepted}/{len(VALID_SKELETONS)}",
            "invalid": f"{rejected}/{len(INVALID_SKELETONS)}",
            "eos": not any("EOS" in p for p in problems),
            "extra_ids": extra_ok,
            "random_walks": f"{walks_ok}/{random_walks}",
        },
        random_walk_chars_mean=statistics.mean(walk_lengths) if walk_lengths else 0,
        correct=not problems and extra_ok,
        problems=problems[:10],
    )
    return result


def _measure_or_report(name: str, **options: Any) -> dict[str, Any]:
    module = LIBRARIES[name]
    try:
        __import__(module)
    except ImportError as exc:
        return {"installed": False, "error": f"cannot import {module}: {exc}"}
    try:
        return {"installed": True, **measure_library(name, **options)}
    except Exception as exc:  # a library failing is a result, not a crash of the comparison
        return {"installed": True, "error": f"{type(exc).__name__}: {exc}"}


def compare_constraints(
    libraries: tuple[str, ...] = tuple(LIBRARIES),
    *,
    random_walks: int = 10,
    extra_ids: int = 64,
    seed: int = 0,
    out: Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Measure each library in its own spawned process, one after another; write the
    result to ``out`` (atomically) when given, and return it. ``progress``: print a line as
    each library starts."""
    unknown = [name for name in libraries if name not in LIBRARIES]
    if unknown:
        raise ValueError(f"unknown libraries {unknown}; choose from {', '.join(LIBRARIES)}")
    results: dict[str, Any] = {}
    context = multiprocessing.get_context("spawn")
    for name in libraries:
        if progress:
            print(f"measuring {name} in a fresh process ...", flush=True)
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            future = pool.submit(
                _measure_or_report,
                name,
                random_walks=random_walks,
                extra_ids=extra_ids,
                seed=seed,
            )
            results[name] = future.result()
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor()},
        "torch_threads": torch.get_num_threads(),
        "regex": DEFAULT_FORMAT.regex(),
        "valid_skeletons": list(VALID_SKELETONS),
        "invalid_skeletons": list(INVALID_SKELETONS),
        "random_walks": random_walks,
        "extra_ids": extra_ids,
        "libraries": results,
    }
    if out is not None:
        write_json_atomic(out, report)
    return report


def format_table(report: dict[str, Any]) -> str:
    """A Markdown table of the report, for docs/skeleton.md."""
    lines = [
        "| library | version | tokenizer s | compile s | first mask ms | mask µs/token "
        "| advance µs/token | copy µs | RSS MB | correct |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in report["libraries"].items():
        if "error" in row:
            lines.append(f"| {name} | | | | | | | | | {row['error']} |")
            continue
        lines.append(
            f"| {name} | {row['version']} | {row['tokenizer_s']:.2f} | {row['compile_s']:.3f} "
            f"| {row['first_mask_ms']:.2f} | {row['mask_us']:.0f} | {row['advance_us']:.1f} "
            f"| {row['copy_us']:.1f} | {row['rss_mb']:.0f} | "
            f"{'yes' if row['correct'] else 'NO: ' + '; '.join(row['problems'][:2])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.constraint_compare", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("results/constraint_compare.json"))
    parser.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=LIBRARIES)
    parser.add_argument("--random-walks", type=int, default=10)
    parser.add_argument("--extra-ids", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    report = compare_constraints(
        tuple(args.libraries),
        random_walks=args.random_walks,
        extra_ids=args.extra_ids,
        seed=args.seed,
        out=args.out,
        progress=True,
    )
    print(format_table(report))
    print(json.dumps({k: v.get("checks") for k, v in report["libraries"].items()}, indent=1))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
