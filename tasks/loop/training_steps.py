"""The retrain's training steps as plain typed functions: the suffix challenger rebuilt from
the trainable traffic, and the learned challengers of ``configs/retrain.yaml`` (head, LoRA)
trained on the dataset's mix. Prefect wraps each in :mod:`tasks.loop.training_tasks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from registry.client import Registry
from serving.engine.drafters.package import DraftManifest, write_package
from serving.engine.drafters.plan import DEFAULT_K, DEFAULT_POLICY
from serving.hardware import HardwareTarget
from serving.records.schema import RequestRecord
from tasks.data.dataset import read_part
from tasks.data.store_view import read_valid_records
from tasks.data.vllm_pairs import Pair
from tasks.loop import retrain_config
from tasks.loop.learned import Trained
from tasks.loop.prefect_run import run_log
from tasks.train.store_teacher import Answered


def trainable_records(
    store_root: Path, dataset_dir: Path, *, hardware: HardwareTarget | None = None
) -> list[RequestRecord]:
    """The store's train-split records (of ``hardware``; every target's for None) less the
    held-out traffic (the newest share per workload, ``heldout_traffic.jsonl`` of the
    dataset): what a challenger may learn from."""
    held = {r.id for r in read_part(dataset_dir, "heldout_traffic")}
    name = None if hardware is None else hardware.name
    return [
        r
        for r in read_valid_records(store_root, hardware_name=name)
        if r.split == "train" and r.id not in held
    ]


def train_suffix_challenger(
    records: Sequence[RequestRecord | Sequence[int]],
    out_dir: Path,
    *,
    k: int = DEFAULT_K,
    source: str = "the store",
) -> Path:
    """A suffix-decoding draft whose corpus is the target's outputs in the trainable
    collected traffic (:func:`trainable_records`; token id lists are taken as they come):
    rebuilt from scratch each time, so it follows drift."""
    from tasks.train.suffix_index import build_suffix_index

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = out_dir / "suffix-corpus.json"
    build_suffix_index(records, corpus)
    return write_package(
        out_dir / "suffix",
        DraftManifest(
            drafter="suffix:corpus.json",
            k=k,
            policy=DEFAULT_POLICY,
            family="suffix",
            description=f"suffix corpus of the target's outputs collected in {source}",
        ),
        files={"corpus.json": corpus},
    )


def captured_pairs(store_root: Path | None, hardware: HardwareTarget) -> list[Pair]:
    """The request/response pairs captured in front of ``hardware``'s vLLM servers
    (:mod:`tasks.data.vllm_pairs`); none on other backends or without a store."""
    from tasks.data.vllm_pairs import read_pairs

    if store_root is None or hardware.backend != "vllm":
        return []
    pairs, rejected = read_pairs(store_root, hardware)
    run_log().info(
        "%d pairs captured in front of vLLM join the training data (%d lines skipped)",
        len(pairs),
        len(rejected),
    )
    return pairs


def train_suffix(
    store_root: Path, dataset_dir: Path, out_dir: Path, *, hardware: HardwareTarget
) -> Path:
    """The suffix challenger from ``hardware``'s trainable records (on a vLLM target, plus
    the answers captured in front of its servers)."""
    records = trainable_records(store_root, dataset_dir, hardware=hardware)
    answers = [pair.output_token_ids for pair in captured_pairs(store_root, hardware)]
    return train_suffix_challenger([*records, *answers], out_dir, source=str(store_root))


def head_to_continue(registry: Registry, hardware: HardwareTarget, cache: Path) -> Path | None:
    """The head a retrain continues from: the head family's champion on ``hardware``, else
    its newest version evaluated there (a head trained before the drift, say, that lost to
    another family), else None (a fresh head)."""
    from registry.client import CHAMPION, alias
    from registry.history import newest_evaluated

    draft = registry.by_alias("head", alias(CHAMPION, hardware.name)) or newest_evaluated(
        registry, "head", hardware.name
    )
    if draft is None:
        return None
    return registry.download(draft, cache) / "head"


def train_learned(
    registry: Registry,
    dataset_dir: Path,
    out_dir: Path,
    *,
    hardware: HardwareTarget,
    budgets: dict[str, float] | None = None,
    store_root: Path | None = None,
) -> list[Trained]:
    """The learned challengers of ``configs/retrain.yaml`` for ``hardware``, trained on the
    dataset's training mix in ``out_dir`` (a retry resumes each from its checkpoint). On a
    vLLM target the request/response pairs captured in front of its servers (the store's
    ``vllm-pairs/``) join the mix."""
    from serving.models.real import cache_root
    from tasks.loop.learned import train_learned_challengers

    config = retrain_config.load_retrain_config().target(hardware)
    if budgets:
        config = config.with_budgets(budgets)
    if not config.families:
        return []
    init_head = head_to_continue(registry, hardware, cache_root() / "registry")
    mix: list[Answered] = [
        *read_part(dataset_dir, "train_mix"),
        *captured_pairs(store_root, hardware),
    ]
    return train_learned_challengers(mix, out_dir, config, init_head=init_head)
