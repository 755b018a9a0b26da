"""Drafter kinds: every kind a drafter spec can name, each declared once.

A drafter spec is ``KIND[:ARG]`` (``pld:3``, ``ngram:4,fallback=target``, ``head:PATH``). Its
:class:`DrafterKind` says how the argument is checked (before anything loads), how the
drafter is built, whether the argument names files (a path inside a draft package), which
stage its drafted tokens are recorded and predicted under, whether a cascade drafts it
eagerly, and its help. Every list of kinds and every spec help derives from
:data:`DRAFTER_KINDS`: the factory's kinds, the package's path kinds, the predictor's stages,
the cascade's eager stages, the loop's built-in drafters, the kinds the HTTP ``drafter``
field accepts, and the help of the errors, the chat and the CLI.

A drafter class names its kind in its ``kind`` attribute, which the engine reads. What its
``describe()`` reports as ``"kind"`` is the kind's wire name (:attr:`DrafterKind.wire`:
``prompt_lookup`` for ``pld``, ``ngram_store`` for ``ngram``), left as it was because
records and responses carry it. Each kind also names the registry family its packages are
registered under by default (:attr:`DrafterKind.family`) and the method other backends run
it as (:attr:`DrafterKind.backend_method`: vLLM's ``ngram`` for ``pld``, ``eagle`` for a
``head``), so no layer keeps its own mapping. Builders import their drafter's module only
when called, so checking a spec loads no model code (nor torch: the CLI's help is built
from here); the drafter modules therefore never import this one (that would be a cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast, get_args

from serving.engine.drafters.args import folder_arg, int_arg, parse_ngram_options
from serving.errors import BadInputError

if TYPE_CHECKING:  # at run time only the builders need them, and import what they build
    from serving.engine.drafters.base import Drafter
    from serving.target import LoadedTarget

# The stage a drafted token is recorded under (a record's ``stage``) and that the acceptance
# predictor one-hot encodes, in its column order (``FEATURE_NAMES``, saved with every
# predictor): add a stage at the end, never reorder.
StageName = Literal["suffix", "pld", "ngram", "head", "model"]
STAGES: tuple[StageName, ...] = get_args(StageName)
# The stage of a drafter that is no registered kind (a remote client's block, a test's):
# what the engine recorded for it before kinds were declared.
DEFAULT_STAGE: StageName = "model"


@dataclass(frozen=True)
class DrafterSpec:
    """A checked spec: its kind's name and its argument (None when it has none)."""

    kind: str
    arg: str | None = None

    def __str__(self) -> str:
        return self.kind if self.arg is None else f"{self.kind}:{self.arg}"


# (spec, the loaded target) -> the drafter, or None for plain decoding. A lookup drafter
# reads nothing of the target and is built without one (a draft client that loaded none).
Builder = Callable[[DrafterSpec, "LoadedTarget | None"], "Drafter | None"]


@dataclass(frozen=True)
class DrafterKind:
    name: str  # the spec's word, e.g. "pld": the ``kind`` its drafter class names
    wire: str  # what its drafter's ``describe()`` reports as "kind" (records, responses)
    # The registry family a package of it is registered under unless its trainer says
    # otherwise (a ``model:`` package is ``lora`` or ``full``, by how it was trained).
    family: str
    # The speculation method other backends run it as (serving.backends: vLLM, mlx-lm,
    # Neuron); None: it runs on the specops engine only.
    backend_method: str | None
    usage: str  # its full syntax, e.g. "pld[:MAX_NGRAM]"
    brief: str  # its short syntax for one-line helps, e.g. "pld[:N]"
    about: str  # what it drafts from ("" when the name says it)
    check: Callable[[str, str | None], None]  # (spec, argument): BadInputError, no loading
    build: Builder
    stage: StageName | None  # its drafted tokens' stage; None: it drafts nothing
    eager: bool = False  # a cascade drafts it every step (a lookup: well under a millisecond)
    # The argument is a file or folder the drafter loads (inside a draft package, relative to
    # it): served by promoting a package, never per HTTP request, and not built in.
    files: bool = False
    # The argument with its package-relative paths made paths by ``inside`` (None: the
    # argument never holds a path).
    relocate: Callable[[str, Callable[[str], str]], str] | None = None
    completions: tuple[str, ...] = ()  # what the chat offers to complete a spec with

    @property
    def builtin(self) -> bool:
        """It drafts, and needs no files: a draft package of it is its manifest alone."""
        return self.stage is not None and not self.files

    @property
    def http(self) -> bool:
        """The HTTP ``drafter`` field accepts it (a drafter with files is promoted instead)."""
        return not self.files

    @property
    def help(self) -> str:
        return f"{self.usage} ({self.about})" if self.about else self.usage


# ------------------------------------------------------------------------- argument checks


def _check_none(spec: str, arg: str | None) -> None:
    if arg:
        raise BadInputError(f"drafter 'none' takes no argument, got {spec!r}")


def _check_pld(spec: str, arg: str | None) -> None:
    int_arg(spec, arg, 3, 1)


def _check_ngram(spec: str, arg: str | None) -> None:
    parse_ngram_options(spec, arg)


def _check_suffix(spec: str, arg: str | None) -> None:
    if arg and not Path(arg).is_file():
        raise BadInputError(f"drafter {spec!r}: {arg!r} is not a suffix corpus file")


def _check_layers(spec: str, arg: str | None) -> None:
    int_arg(spec, arg, None, 1)


def _check_model(spec: str, arg: str | None) -> None:
    folder_arg(spec, arg, "a model folder", "model:PATH")


def _check_lora(spec: str, arg: str | None) -> None:
    folder_arg(spec, arg, "a LoRA adapter folder", "lora:PATH")


def _check_head(spec: str, arg: str | None) -> None:
    folder_arg(spec, arg, "a draft-head folder", "head:PATH")


# -------------------------------------------------------------- package-relative paths


def _whole_path(arg: str, inside: Callable[[str], str]) -> str:
    return inside(arg)


def _store_path(arg: str, inside: Callable[[str], str]) -> str:
    """An n-gram spec's ``store=PATH`` (its shared store's corpus file) made a path."""
    parts = [part.strip() for part in arg.split(",")]
    if not any(part.lower().startswith("store=") for part in parts):
        return arg
    return ",".join(
        f"store={inside(part.partition('=')[2].strip())}"
        if part.lower().startswith("store=")
        else part
        for part in parts
    )


# ------------------------------------------------------------------------------ builders


def _needed(spec: DrafterSpec, target: LoadedTarget | None) -> LoadedTarget:
    """The target a drafter built from it (or served like it) needs."""
    if target is None:
        raise BadInputError(
            f"drafter {str(spec)!r} drafts with a model of the target's: load the target "
            "where it is built"
        )
    return target


def _build_none(spec: DrafterSpec, target: LoadedTarget | None) -> None:
    return None


def _build_pld(spec: DrafterSpec, target: LoadedTarget | None) -> Drafter:
    from serving.engine.drafters.prompt_lookup import PromptLookupDrafter

    return PromptLookupDrafter(max_ngram=int_arg(str(spec), spec.arg, 3, 1))


def _build_ngram(spec: DrafterSpec, target: LoadedTarget | None) -> Drafter:
    from serving.engine.drafters.ngram_store import NGramDrafter, load_shared_store

    options = parse_ngram_options(str(spec), spec.arg)
    shared = None if options.store is None else load_shared_store(options.store, options.n)
    return NGramDrafter(
        n=options.n,
        fallback=options.fallback,
        shared=shared,
        min_confidence=options.min_conf,
        store_source=options.store,
    )


def _build_suffix(spec: DrafterSpec, target: LoadedTarget | None) -> Drafter:
    from serving.engine.drafters.suffix import suffix_drafter

    return suffix_drafter(spec.arg)


def _build_layers(spec: DrafterSpec, target: LoadedTarget | None) -> Drafter:
    from serving.engine.drafters.model import ModelDrafter
    from serving.models.truncated import first_layers

    target = _needed(spec, target)
    layers = int_arg(str(spec), spec.arg, None, 1)
    # The target's own first layers, on the same kind of lean step as the target.
    return ModelDrafter(target.over(first_layers(target.model, layers)), name=str(spec))


def _build_model(spec: DrafterSpec, target: LoadedTarget | None) -> Drafter:
    from serving.engine.drafters.model import load_model_drafter

    target = _needed(spec, target)
    assert spec.arg is not None  # checked: model:PATH
    return load_model_drafter(spec.arg, target, name=str(spec))


def _build_lora(spec: DrafterSpec, target: LoadedTarget | None) -> Drafter:
    import torch

    from serving.engine.drafters.model import model_drafter_for
    from serving.models.lora import load_lora_draft

    target = _needed(spec, target)
    assert spec.arg is not None  # checked: lora:PATH
    model = load_lora_draft(spec.arg, target.model)  # merged in fp32 ...
    cast(torch.nn.Module, model).to(target.dtype)  # ... then in its target's dtype, in place
    return model_drafter_for(model, target, name=str(spec))


def _build_head(spec: DrafterSpec, target: LoadedTarget | None) -> Drafter:
    from serving.engine.drafters.head import HeadDrafter
    from serving.models.head import load_head

    target = _needed(spec, target)
    assert spec.arg is not None  # checked: head:PATH
    return HeadDrafter(load_head(spec.arg, target.model), target, name=str(spec))


# ------------------------------------------------------------------------------- the kinds

DRAFTER_KINDS: tuple[DrafterKind, ...] = (
    DrafterKind(
        name="none",
        wire="none",
        family="none",
        backend_method="none",
        usage="none",
        brief="none",
        about="",
        check=_check_none,
        build=_build_none,
        stage=None,
        completions=("none",),
    ),
    DrafterKind(
        name="pld",
        wire="prompt_lookup",
        family="ngram",
        backend_method="ngram",
        usage="pld[:MAX_NGRAM]",
        brief="pld[:N]",
        about="prompt lookup",
        check=_check_pld,
        build=_build_pld,
        stage="pld",
        eager=True,
        completions=("pld", "pld:3"),
    ),
    DrafterKind(
        name="ngram",
        wire="ngram_store",
        family="ngram",
        backend_method=None,
        usage="ngram[:N][,fallback=stop|shared|target][,min_conf=X][,store=PATH]",
        brief="ngram[:N][,...]",
        about="n-gram store, k-grams 2..N; docs/engine.md",
        check=_check_ngram,
        build=_build_ngram,
        stage="ngram",
        eager=True,
        relocate=_store_path,
        completions=("ngram:4", "ngram:4,fallback=target"),
    ),
    DrafterKind(
        name="suffix",
        wire="suffix",
        family="suffix",
        backend_method="suffix",
        usage="suffix[:PATH]",
        brief="suffix[:PATH]",
        about="suffix match on the request, plus a corpus file of earlier outputs",
        check=_check_suffix,
        build=_build_suffix,
        stage="suffix",
        eager=True,
        files=True,
        relocate=_whole_path,
        completions=("suffix",),
    ),
    DrafterKind(
        name="layers",
        wire="model",
        family="draft",
        backend_method="draft_model",
        usage="layers:N",
        brief="layers:N",
        about="the target's first N layers",
        check=_check_layers,
        build=_build_layers,
        stage="model",
        completions=("layers:4",),
    ),
    DrafterKind(
        name="model",
        wire="model",
        family="full",
        backend_method="draft_model",
        usage="model:PATH",
        brief="model:PATH",
        about="a causal LM folder sharing the target's tokenizer",
        check=_check_model,
        build=_build_model,
        stage="model",
        files=True,
        relocate=_whole_path,
        completions=("model:",),
    ),
    DrafterKind(
        name="head",
        wire="head",
        family="head",
        backend_method="eagle",
        usage="head:PATH",
        brief="head:PATH",
        about="a draft-head folder trained on the target's features",
        check=_check_head,
        build=_build_head,
        stage="head",
        files=True,
        relocate=_whole_path,
        completions=("head:",),
    ),
    DrafterKind(
        name="lora",
        wire="model",
        family="lora",
        backend_method="draft_model",
        usage="lora:PATH",
        brief="lora:PATH",
        about="a LoRA adapter over the target's first N layers, merged when it loads",
        check=_check_lora,
        build=_build_lora,
        stage="model",
        files=True,
        relocate=_whole_path,
        completions=("lora:",),
    ),
)
KIND_BY_NAME: dict[str, DrafterKind] = {kind.name: kind for kind in DRAFTER_KINDS}

# Every list of kinds, derived (in DRAFTER_KINDS' order).
KINDS: tuple[str, ...] = tuple(KIND_BY_NAME)
PATH_KINDS: tuple[str, ...] = tuple(k.name for k in DRAFTER_KINDS if k.files)
BUILTIN_KINDS: tuple[str, ...] = tuple(k.name for k in DRAFTER_KINDS if k.builtin)
HTTP_KINDS: tuple[str, ...] = tuple(k.name for k in DRAFTER_KINDS if k.http)
# Kinds that draft with a causal LM of their own (a model export, a client-side draft model).
MODEL_KINDS: tuple[str, ...] = tuple(k.name for k in DRAFTER_KINDS if k.stage == "model")
EAGER_STAGES: tuple[StageName, ...] = tuple(
    dict.fromkeys(k.stage for k in DRAFTER_KINDS if k.eager and k.stage is not None)
)


def kind_of(spec: str) -> DrafterKind | None:
    """The kind a spec string names (``pld`` for ``pld:3``), unchecked; None when it names
    none. The one place a spec string is split (its argument is checked by the kind)."""
    return KIND_BY_NAME.get(split_spec(spec)[0].lower())


def split_spec(spec: str) -> tuple[str, str | None]:
    """``("pld", "3")`` for ``pld:3``, ``("pld", None)`` for ``pld``: a spec's word and
    argument, unchecked."""
    name, _, arg = spec.strip().partition(":")
    return name, arg or None


def stage_of(kind: str) -> StageName:
    """The stage a drafter of ``kind`` (its ``kind`` attribute) drafts as; a drafter of no
    registered kind drafts as :data:`DEFAULT_STAGE`."""
    known = KIND_BY_NAME.get(kind)
    if known is None or known.stage is None:
        return DEFAULT_STAGE
    return known.stage


def spec_help(kinds: Sequence[str] = KINDS) -> str:
    """Each kind's syntax and what it drafts from: ``none | pld[:MAX_NGRAM] (prompt
    lookup) | ...``."""
    return " | ".join(KIND_BY_NAME[name].help for name in kinds)


def spec_syntax(kinds: Sequence[str] = KINDS, *, sep: str = " | ") -> str:
    """The short syntax of each kind, for one-line helps: ``none | pld[:N] | ...``."""
    return sep.join(KIND_BY_NAME[name].brief for name in kinds)


SPEC_HELP = spec_help()
SPEC_SYNTAX = spec_syntax()
