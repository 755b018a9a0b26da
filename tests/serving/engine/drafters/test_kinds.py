"""The registry of drafter kinds: each kind declared once; every drafter class names a kind;
every kind parses, builds and drafts on the tiny target under its stage; every list and help
derives from the registry; the engine reads a drafter's ``kind``, never its ``describe()``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from transformers import PreTrainedModel

import serving
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters import factory
from serving.engine.drafters.base import Drafter, DraftProposal, DraftRequest
from serving.engine.drafters.factory import build_drafter, parse_drafter_spec
from serving.engine.drafters.kinds import (
    BUILTIN_KINDS,
    DEFAULT_STAGE,
    DRAFTER_KINDS,
    EAGER_STAGES,
    HTTP_KINDS,
    KIND_BY_NAME,
    KINDS,
    MODEL_KINDS,
    PATH_KINDS,
    SPEC_HELP,
    SPEC_SYNTAX,
    STAGES,
    DrafterKind,
    kind_of,
    spec_help,
    spec_syntax,
    split_spec,
    stage_of,
)
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.errors import BadInputError

# Drafters that no spec builds on its own: a cascade (built from its stages' specs) and a
# distributed client's block (the drafts a remote client sent).
COMPOSITE = ("cascade", "client")


def _serving_drafter_classes() -> list[type[Drafter]]:
    """Every Drafter subclass the serving package defines (its modules found by their
    source, so that a new drafter module is covered without being listed here)."""
    root = Path(serving.__file__).parent
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(
            isinstance(node, ast.ClassDef)
            and any(
                getattr(base, "id", getattr(base, "attr", "")) == "Drafter" for base in node.bases
            )
            for node in ast.walk(tree)
        ):
            module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
            importlib.import_module(module)
    found, pending = [], list(Drafter.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith("serving."):
            found.append(cls)
    return found


def test_every_drafter_class_names_a_registered_kind():
    classes = _serving_drafter_classes()
    names = {cls.__name__ for cls in classes}
    assert {"PromptLookupDrafter", "ModelDrafter", "CascadeDrafter", "ClientBlock"} <= names
    for cls in classes:
        assert cls.kind != Drafter.kind, f"{cls.__name__} does not name its kind"
        assert cls.kind in KINDS or cls.kind in COMPOSITE, (cls.__name__, cls.kind)
    built = {cls.kind for cls in classes} - set(COMPOSITE)
    # every kind that drafts is built as one of these classes (layers, lora: a ModelDrafter)
    assert built == {k.name for k in DRAFTER_KINDS if k.stage is not None} - {"layers", "lora"}
    assert not set(COMPOSITE) & set(KINDS)


def test_each_kind_is_declared_once():
    assert len({kind.name for kind in DRAFTER_KINDS}) == len(DRAFTER_KINDS)
    assert tuple(kind.name for kind in DRAFTER_KINDS) == KINDS
    assert all(KIND_BY_NAME[kind.name] is kind for kind in DRAFTER_KINDS)


def test_the_lists_of_kinds_derive_from_the_registry():
    from serving.engine.predictor import FEATURE_NAMES
    from serving.server.schemas import HTTP_DRAFTERS

    # Today's values, which are stored or sent, or order the predictor's columns.
    assert KINDS == ("none", "pld", "ngram", "suffix", "layers", "model", "head", "lora")
    assert (factory.KINDS, factory.SPEC_HELP) == (KINDS, SPEC_HELP)
    assert PATH_KINDS == ("suffix", "model", "head", "lora")
    assert BUILTIN_KINDS == ("pld", "ngram", "layers")
    assert HTTP_KINDS == ("none", "pld", "ngram", "layers")
    assert MODEL_KINDS == ("layers", "model", "lora")
    assert ("champion", *HTTP_KINDS, "cascade") == HTTP_DRAFTERS
    assert STAGES == ("suffix", "pld", "ngram", "head", "model")
    assert FEATURE_NAMES[-len(STAGES) :] == tuple(f"stage_{stage}" for stage in STAGES)
    assert set(EAGER_STAGES) == {"suffix", "pld", "ngram"}
    # Every stage is some kind's, and no stage is eager for one kind and lazy for another.
    assert {kind.stage for kind in DRAFTER_KINDS if kind.stage} == set(STAGES)
    for kind in DRAFTER_KINDS:
        if kind.stage is not None:
            assert kind.eager == (kind.stage in EAGER_STAGES), kind.name
    # The derived flags: files exclude a kind from HTTP and from the built-ins.
    for kind in DRAFTER_KINDS:
        assert kind.http == (kind.name not in PATH_KINDS)
        assert kind.builtin == (kind.name not in PATH_KINDS and kind.name != "none")


def test_the_help_lists_every_kind():
    assert spec_help() == SPEC_HELP and spec_syntax() == SPEC_SYNTAX
    assert SPEC_HELP.split(" | ")[0] == "none" and SPEC_SYNTAX.split(" | ")[0] == "none"
    assert len(SPEC_SYNTAX.split(" | ")) == len(KINDS)
    for kind in DRAFTER_KINDS:
        assert kind.help in SPEC_HELP and kind.brief in SPEC_SYNTAX
        assert kind.usage.startswith(kind.name) and kind.brief.startswith(kind.name)
    with pytest.raises(BadInputError) as raised:
        parse_drafter_spec("warp:3")
    assert str(raised.value) == f"unknown drafter 'warp:3'; use one of: {SPEC_HELP}"
    assert spec_syntax(BUILTIN_KINDS, sep=", ") == "pld[:N], ngram[:N][,...], layers:N"


def test_the_chat_offers_every_kind():
    from specops.chat.commands import COMMANDS

    (drafter,) = [command for command in COMMANDS if command.name == "drafter"]
    assert SPEC_SYNTAX in drafter.summary
    for kind in DRAFTER_KINDS:
        assert kind.completions, kind.name
        for spec in kind.completions:
            assert split_spec(spec)[0] == kind.name


def _spec_for(kind: DrafterKind, folder: Path, target: PreTrainedModel, lora_adapter) -> str:
    """A spec of ``kind`` that builds on the tiny target, with the files it needs
    (``lora_adapter``: the conftest fixture that writes an adapter)."""
    if kind.name == "suffix" or kind.name == "ngram":
        from serving.engine.drafters.suffix import SuffixCorpus
        from tasks.train.suffix_index import save_suffix_index

        corpus = folder / "corpus.json"
        save_suffix_index(SuffixCorpus(((5, 17, 42, 8), (5, 17, 9)), {}), corpus)
        return (
            f"suffix:{corpus}"
            if kind.name == "suffix"
            else f"ngram:3,store={corpus},fallback=shared"
        )
    if kind.name == "model":
        from serving.models.tiny import tiny_llama

        tiny_llama(num_layers=1, seed=3).save_pretrained(folder / "draft")
        return f"model:{folder / 'draft'}"
    if kind.name == "lora":
        return f"lora:{lora_adapter(target, folder / 'adapter', layers=1)}"
    if kind.name == "head":
        import torch

        from serving.models.head import DraftHead, head_config_for, save_head

        torch.manual_seed(0)
        head = DraftHead(head_config_for(target, intermediate_size=48)).eval()
        return f"head:{save_head(head, folder / 'head')}"
    return {"none": "none", "pld": "pld:3", "layers": "layers:1"}[kind.name]


@pytest.mark.parametrize("kind", DRAFTER_KINDS, ids=lambda kind: kind.name)
def test_every_kind_parses_builds_and_drafts_under_its_stage(
    kind, tmp_path, loaded, prompt, greedy_reference, lora_adapter
):
    spec = _spec_for(kind, tmp_path, loaded.model, lora_adapter)
    parsed = parse_drafter_spec(spec)
    assert parsed.kind == kind.name and str(parsed) == spec
    drafter = build_drafter(spec, loaded)
    if kind.stage is None:
        assert drafter is None
        return
    assert isinstance(drafter, Drafter)
    assert stage_of(drafter.kind) == kind.stage
    decoder = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(3))
    result = decoder.generate(prompt, max_new_tokens=16, mode="detailed")
    assert result.token_ids == greedy_reference[:16]  # lossless, whatever it drafted
    assert result.record is not None
    assert {row.stage for row in result.record.drafted} <= {kind.stage}


def test_a_package_resolves_each_kinds_paths():
    def inside(path: str) -> str:
        return f"/package/{path}"

    for name in PATH_KINDS:
        relocate = KIND_BY_NAME[name].relocate
        assert relocate is not None and relocate("weights", inside) == "/package/weights"
    ngram = KIND_BY_NAME["ngram"].relocate
    assert ngram is not None
    assert (
        ngram("4,fallback=shared,store=s.json", inside) == "4,fallback=shared,store=/package/s.json"
    )
    assert ngram("4, fallback=target", inside) == "4, fallback=target"  # no path: as it was
    assert all(KIND_BY_NAME[name].relocate is None for name in ("none", "pld", "layers"))


def test_a_drafter_of_no_registered_kind_drafts_as_the_default_stage():
    assert DEFAULT_STAGE == "model"
    for kind in (*COMPOSITE, Drafter.kind, "none"):
        assert stage_of(kind) == DEFAULT_STAGE


def test_the_engine_reads_the_kind_not_the_description(loaded, prompt):
    class Relabelled(PromptLookupDrafter):
        kind = "ngram"  # describe() still says "prompt_lookup"

    drafter = Relabelled()
    assert drafter.describe()["kind"] == "prompt_lookup"
    decoder = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(3))
    assert decoder.stage == "ngram"
    result = decoder.generate(prompt * 2, max_new_tokens=16, mode="detailed")
    assert result.record is not None and result.record.drafted
    assert {row.stage for row in result.record.drafted} == {"ngram"}


class _ContextReader(PromptLookupDrafter):
    """Prompt lookup that records the context each propose received."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts: list[object] = []

    def propose(self, request: DraftRequest) -> DraftProposal:
        self.contexts.append(request.context)
        return super().propose(request)


@pytest.mark.parametrize("needs_context", [False, True])
def test_needs_context_is_declared_on_the_base_and_read_by_the_engine(
    loaded, prompt, needs_context
):
    assert Drafter.needs_context is False
    drafter = _ContextReader()
    drafter.needs_context = needs_context
    decoder = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(3))
    decoder.generate(prompt, max_new_tokens=8)  # fast mode: no context unless asked for
    assert drafter.contexts
    assert all((context is not None) == needs_context for context in drafter.contexts)


# What each kind is called where it is stored or sent (describe()'s "kind", which records
# and responses carry), the registry family its packages are registered under by default,
# and the speculation method the other backends run it as (None: the specops engine only).
WIRE = {
    "none": "none",
    "pld": "prompt_lookup",
    "ngram": "ngram_store",
    "suffix": "suffix",
    "layers": "model",
    "model": "model",
    "head": "head",
    "lora": "model",
}
FAMILY = {
    "none": "none",
    "pld": "ngram",
    "ngram": "ngram",
    "suffix": "suffix",
    "layers": "draft",
    "model": "full",
    "head": "head",
    "lora": "lora",
}
BACKEND_METHOD = {
    "none": "none",
    "pld": "ngram",
    "ngram": None,
    "suffix": "suffix",
    "layers": "draft_model",
    "model": "draft_model",
    "head": "eagle",
    "lora": "draft_model",
}
# A spec of each kind as a package's draft.json names it (speculation_for reads the string).
STORED_SPECS = {
    "none": "none",
    "pld": "pld:5",
    "ngram": "ngram:4",
    "suffix": "suffix:corpus.json",
    "layers": "layers:2",
    "model": "model:weights",
    "head": "head:weights",
    "lora": "lora:adapter",
}


@pytest.mark.parametrize("kind", DRAFTER_KINDS, ids=lambda kind: kind.name)
def test_each_kinds_wire_name_is_what_its_drafter_describes(kind, tmp_path, loaded, lora_adapter):
    assert kind.wire == WIRE[kind.name]
    drafter = build_drafter(_spec_for(kind, tmp_path, loaded.model, lora_adapter), loaded)
    if kind.stage is None:
        assert drafter is None
        return
    assert drafter is not None and drafter.describe()["kind"] == kind.wire


def test_every_kind_has_a_family_and_a_backend_method():
    assert set(WIRE) == set(FAMILY) == set(BACKEND_METHOD) == set(STORED_SPECS) == set(KINDS)
    for kind in DRAFTER_KINDS:
        assert (kind.family, kind.backend_method) == (
            FAMILY[kind.name],
            BACKEND_METHOD[kind.name],
        ), kind.name
        # A registered model's name is <prefix>-<family> (registry.client.model_name).
        assert kind.family and all(c.isalnum() or c in "-_" for c in kind.family)


@pytest.mark.parametrize("kind", DRAFTER_KINDS, ids=lambda kind: kind.name)
def test_each_kinds_backend_method_is_what_an_export_runs(kind):
    """tasks/evaluate/export.py turns a package's spec into the backend's speculation
    method of its kind, on every backend that runs that method, and refuses it on every
    other (a kind with no method: on all of them)."""
    from serving.backends import BACKENDS, UnsupportedDraftError
    from tasks.evaluate.export import speculation_for

    spec = STORED_SPECS[kind.name]
    assert kind_of(spec) is kind
    for backend, info in BACKENDS.items():
        if kind.backend_method is not None and kind.backend_method in info.methods:
            speculation = speculation_for(spec, backend, 4)
            assert speculation.method == kind.backend_method, (kind.name, backend)
        else:
            with pytest.raises(
                UnsupportedDraftError,
                match=repr(spec) if kind.backend_method is None else "cannot draft",
            ):
                speculation_for(spec, backend, 4)
    if kind.backend_method is not None:
        assert any(kind.backend_method in info.methods for info in BACKENDS.values())
    if kind.name == "pld":  # vLLM's ngram method looks up to the spec's longest n-gram
        assert speculation_for(spec, "vllm", 4).prompt_lookup_max == 5
