"""Damage a draft's weights on disk so that it still loads but proposes wrong tokens: the
silent failure the watched champion (:mod:`tasks.loop.watch`) must catch, injected on
purpose by the main job's drill (:mod:`flows.demo`) and by tests.

Every tensor of every ``*.safetensors`` file under the package keeps its name, shape and
dtype; its values are permuted (a fixed seed per file), so the draft loads and drafts as
fast as before, from weights that no longer mean anything. Each file is replaced
atomically. A package without safetensors weights (an n-gram or suffix draft) is refused:
there is nothing of that kind to damage.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from serving.errors import BadInputError


def scramble_weights(folder: str | Path, *, seed: int = 0) -> list[Path]:
    """Permute the values of every tensor in ``folder``'s safetensors files in place; the
    files changed, sorted."""
    import torch
    from safetensors.torch import load_file, save_file

    from serving.atomic import atomic_path

    folder = Path(folder)
    files = sorted(folder.rglob("*.safetensors"))
    if not files:
        raise BadInputError(
            f"{str(folder)!r} holds no *.safetensors weights to scramble (an n-gram or suffix "
            "draft has none)"
        )
    for path in files:
        generator = torch.Generator().manual_seed(seed + zlib.crc32(path.name.encode()))
        tensors = load_file(path)
        scrambled = {}
        for name, tensor in tensors.items():
            flat = tensor.reshape(-1)
            order = torch.randperm(flat.numel(), generator=generator)
            scrambled[name] = flat[order].reshape(tensor.shape).contiguous()
        with atomic_path(path) as scratch:
            save_file(scrambled, str(scratch))
    return files
