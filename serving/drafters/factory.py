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
    "none | pld[:MAX_NGRAM] (prompt lookup) | ngram[:N] (n-gram store, k-grams 2..N) | "
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
        _int_arg(spec, arg_or_none, 4, 2)
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
        return NGramDrafter(n=_int_arg(text, parsed.arg, 4, 2))
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
