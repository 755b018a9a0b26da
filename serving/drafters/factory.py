"""Drafter specs: the strings users type (``none``, ``pld``, ``ngram:4``, ``layers:4``,
``model:PATH``, ``head:PATH``) parsed into drafters. Parsing is split from building so that
a bad spec fails before any model is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from serving.drafters.base import Drafter
from serving.errors import BadInputError, IncompatibleDraftError
from serving.models.kernels import apply_kernels, kernels_of

KINDS = ("none", "pld", "ngram", "suffix", "layers", "model", "head")
SPEC_HELP = (
    "none | pld[:MAX_NGRAM] (prompt lookup) | ngram[:N][,fallback=stop|shared|target]"
    "[,min_conf=X][,store=PATH] (n-gram store, k-grams 2..N; docs/engine.md) | "
    "suffix[:PATH] (suffix match on the request, plus a corpus file of earlier outputs) | "
    "layers:N (the target's first N layers) | model:PATH (a causal LM folder sharing the "
    "target's tokenizer) | head:PATH (a draft-head folder trained on the target's features)"
)


@dataclass(frozen=True)
class DrafterSpec:
    kind: str
    arg: str | None = None

    def __str__(self) -> str:
        return self.kind if self.arg is None else f"{self.kind}:{self.arg}"


def _int_arg(spec: str, arg: str | None, default: int | None, low: int) -> int:
    if arg is None:
        if default is None:
            raise BadInputError(f"drafter {spec!r} needs a number, e.g. {spec}:4")
        return default
    try:
        value = int(arg)
    except ValueError:
        raise BadInputError(f"drafter {spec!r}: {arg!r} is not an integer") from None
    if value < low:
        raise BadInputError(f"drafter {spec!r}: the number must be >= {low}, got {value}")
    return value


NGRAM_FALLBACKS = ("stop", "shared", "target")
NGRAM_HELP = (
    "ngram[:N][,fallback=stop|shared|target][,min_conf=X][,store=PATH]: N >= 2 (default 4); "
    "fallback when the request's own n-grams know no continuation: stop drafting (default), "
    "a shared store built from a corpus file (store=PATH, needs fallback=shared), or the "
    "target's own guesses from its last pass (target); min_conf in [0, 1] stops a draft at "
    "a less frequent continuation"
)


@dataclass(frozen=True)
class NgramOptions:
    """The options of an ``ngram`` spec (its argument after ``ngram:``)."""

    n: int = 4
    fallback: str = "stop"
    min_conf: float = 0.0
    store: str | None = None

    def arg(self) -> str | None:
        """The spec argument that parses back to these options (None: all defaults)."""
        extras = []
        if self.fallback != "stop":
            extras.append(f"fallback={self.fallback}")
        if self.min_conf:
            extras.append(f"min_conf={self.min_conf:g}")
        if self.store is not None:
            extras.append(f"store={self.store}")
        if self.n == 4 and not extras:
            return None
        return ",".join([str(self.n), *extras])


def parse_ngram_options(spec: str, arg: str | None) -> NgramOptions:
    """The options of ``ngram[:ARG]``; :class:`BadInputError` naming the bad part."""
    if not arg:
        return NgramOptions()
    first, *rest = [part.strip() for part in arg.split(",")]
    n = 4
    if "=" not in first:
        n = _int_arg(spec, first, 4, 2)
    else:
        rest = [first, *rest]
    values: dict[str, str] = {}
    for part in rest:
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in ("fallback", "min_conf", "store") or not value.strip():
            raise BadInputError(f"drafter {spec!r}: {part!r} is not an n-gram option; {NGRAM_HELP}")
        if key in values:
            raise BadInputError(f"drafter {spec!r}: {key} is given twice")
        values[key] = value.strip()
    fallback = values.get("fallback", "stop").lower()
    if fallback not in NGRAM_FALLBACKS:
        raise BadInputError(
            f"drafter {spec!r}: fallback={fallback!r} is not one of {', '.join(NGRAM_FALLBACKS)}"
        )
    try:
        min_conf = float(values.get("min_conf", "0"))
    except ValueError:
        raise BadInputError(
            f"drafter {spec!r}: min_conf={values['min_conf']!r} is not a number"
        ) from None
    if not 0.0 <= min_conf <= 1.0:
        raise BadInputError(f"drafter {spec!r}: min_conf={min_conf:g} is not in [0, 1]")
    store = values.get("store")
    if (fallback == "shared") != (store is not None):
        raise BadInputError(
            f"drafter {spec!r}: fallback=shared and store=PATH go together (the shared store "
            "is built from the corpus file at PATH)"
        )
    if store is not None and not Path(store).is_file():
        raise BadInputError(f"drafter {spec!r}: store={store!r} is not a corpus file")
    return NgramOptions(n, fallback, min_conf, store)


def parse_drafter_spec(spec: str) -> DrafterSpec:
    """Check a drafter spec without loading anything."""
    if not isinstance(spec, str) or not spec.strip():
        raise BadInputError(f"empty drafter spec {spec!r}; use one of: {SPEC_HELP}")
    kind, _, arg = spec.strip().partition(":")
    kind = kind.lower()
    arg_or_none = arg or None
    if kind not in KINDS:
        raise BadInputError(f"unknown drafter {spec!r}; use one of: {SPEC_HELP}")
    if kind == "none" and arg_or_none:
        raise BadInputError(f"drafter 'none' takes no argument, got {spec!r}")
    if kind == "pld":
        _int_arg(spec, arg_or_none, 3, 1)
    if kind == "ngram":
        parse_ngram_options(spec, arg_or_none)
    if kind == "suffix" and arg_or_none and not Path(arg_or_none).is_file():
        raise BadInputError(f"drafter {spec!r}: {arg_or_none!r} is not a suffix corpus file")
    if kind == "layers":
        _int_arg(spec, arg_or_none, None, 1)
    if kind == "model":
        if not arg_or_none:
            raise BadInputError(f"drafter {spec!r} needs a path: model:PATH")
        if not Path(arg_or_none).is_dir():
            raise BadInputError(f"drafter {spec!r}: {arg_or_none!r} is not a model folder")
    if kind == "head":
        if not arg_or_none:
            raise BadInputError(f"drafter {spec!r} needs a path: head:PATH")
        if not Path(arg_or_none).is_dir():
            raise BadInputError(f"drafter {spec!r}: {arg_or_none!r} is not a draft-head folder")
    return DrafterSpec(kind, arg_or_none)


def _check_same_tokenizer(path: str, target_tokenizer) -> None:
    from transformers import AutoTokenizer

    try:
        draft_tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return  # no tokenizer shipped with the draft: the vocabulary-size check still runs
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise IncompatibleDraftError(
            f"the draft at {path!r} uses a different tokenizer from the target's; a draft "
            "must share the target's tokenizer token for token"
        )


def build_drafter(spec: str | DrafterSpec, target, target_tokenizer=None) -> Drafter | None:
    """Build the drafter for ``spec`` against ``target`` (``None`` for plain decoding)."""
    from serving.drafters.model import ModelDrafter
    from serving.drafters.ngram_store import NGramDrafter
    from serving.drafters.prompt_lookup import PromptLookupDrafter
    from serving.models.truncated import first_layers

    parsed = parse_drafter_spec(spec) if isinstance(spec, str) else spec
    text = str(parsed)
    if parsed.kind == "none":
        return None
    if parsed.kind == "pld":
        return PromptLookupDrafter(max_ngram=_int_arg(text, parsed.arg, 3, 1))
    if parsed.kind == "ngram":
        options = parse_ngram_options(text, parsed.arg)
        shared = None
        if options.store is not None:
            from serving.drafters.ngram_store import load_shared_store

            shared = load_shared_store(options.store, options.n)
        return NGramDrafter(
            n=options.n,
            fallback=options.fallback,
            shared=shared,
            min_confidence=options.min_conf,
            store_source=options.store,
        )
    if parsed.kind == "suffix":
        from serving.drafters.suffix import suffix_drafter

        return suffix_drafter(parsed.arg)
    if parsed.kind == "layers":
        layers = _int_arg(text, parsed.arg, None, 1)
        return ModelDrafter(first_layers(target, layers), name=text)
    if parsed.kind == "head":
        from serving.drafters.head import HeadDrafter
        from serving.models.head import load_head

        assert parsed.arg is not None
        return HeadDrafter(load_head(parsed.arg, target), target, name=text)
    # model:PATH
    from transformers import AutoModelForCausalLM

    assert parsed.arg is not None
    if target_tokenizer is not None:
        _check_same_tokenizer(parsed.arg, target_tokenizer)
    # The draft runs where its target runs, in its target's dtype.
    weight = next(target.parameters())
    model = AutoModelForCausalLM.from_pretrained(parsed.arg, dtype=weight.dtype).eval()
    if weight.device.type != "cpu":
        model = model.to(weight.device)
    apply_kernels(model, kernels_of(target), exact=False)  # its target's kernels
    drafter = ModelDrafter(model, name=text)
    drafter.check_compatible(int(target.config.vocab_size))
    return drafter
