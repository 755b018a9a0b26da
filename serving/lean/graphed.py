"""The lean step on a GPU (the ``cuda`` target): a static KV cache, and each block size's
pass captured once as a CUDA graph.

On a GPU a small target's pass is launch-bound: SmolLM2-135M's ~18 ms per pass through
transformers' forward is Python and kernel launches, not arithmetic. Here the whole pass —
embedding, every decoder layer, the final norm and the output head — is plain torch over
fixed shapes: the keys and values live in one ``[layers, kv_heads, capacity, head_dim]``
buffer pair that the step owns, every row attends over the whole capacity with a mask
``position <= row's position`` (so stale entries past a rewind never count and a rewind
only lowers a length), and the new keys and values are written with ``index_copy_`` at
positions held in a tensor. A pass of ``rows`` tokens therefore has one shape whatever the
position, and is captured once (``torch.cuda.CUDAGraph``, on first use of that block size,
after a warm-up on a side stream) and replayed after copying the ids and positions in.
Prefills longer than :data:`MAX_GRAPH_ROWS` run the same code eagerly.

Several requests share the step's one buffer pair: the request that runs a pass is made
*resident* first (the one there copies its live prefix out, the newcomer copies its own
in: a few megabytes on a device that moves terabytes a second), so a single stream of
requests (the bench, ``specops chat``, a distributed target with one client) never copies.
A packed pass over several requests (the server's batches) runs them one after another
through the same graphs, exact by construction, not batched.

Exactness on ``cuda`` is what it is for transformers' forward there: a k-row pass need not
round every row as a one-row pass does (cuBLAS picks kernels by shape), so exact means
every speculative output equals plain output token for token on the test prompts, in
float32 (``tests/serving/test_device.py``, ``tests/serving/lean/test_graphed.py``). On the
CPU the same code runs eagerly (``capture=False``): that is how it is tested here.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn import functional as F
from transformers import PreTrainedModel

from serving.errors import BadInputError, SpecOpsError
from serving.lean.cache import Length
from serving.lean.step import LeanOutput

log = logging.getLogger(__name__)
MAX_GRAPH_ROWS = 16  # block sizes captured: 1 .. this (a verification of up to 15 drafts)
INITIAL_CAPACITY = 1024  # positions; doubled (and the graphs captured again) when outgrown
WARMUP = 2  # eager passes on a side stream before a capture (cuBLAS picks its kernels)


def graphs_wanted(device: torch.device) -> bool:
    """Whether passes on ``device`` are captured: on CUDA unless ``SPECOPS_CUDA_GRAPHS=off``
    (the same step, eager: to measure what the graphs buy)."""
    setting = os.environ.get("SPECOPS_CUDA_GRAPHS", "on")
    if setting not in ("on", "off"):
        raise BadInputError(f"SPECOPS_CUDA_GRAPHS={setting!r}: choose 'on' or 'off'")
    return device.type == "cuda" and setting == "on"


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why :class:`GraphedStep` cannot run ``model`` (``None`` when it can): transformers'
    Llama family, its linear layers torch's own (fused or not), default rotary embeddings."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) != "llama":
        return (
            f"architecture {getattr(config, 'model_type', type(model).__name__)!r} is not Llama's"
        )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"its rotary embeddings are {rope['rope_type']!r}, not default"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its activation is {config.hidden_act!r}, not silu"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return "it has no decoder layers where Llama keeps them (model.model.layers)"
    for name, module in layers[0].named_modules():
        if name.endswith("_proj") and type(module) is not torch.nn.Linear:
            return f"its {name} is {type(module).__name__}, not torch's Linear"
    return None


class GraphedCache(Length):
    """One request's place in a :class:`GraphedStep`: its length, and its keys and values
    while another request is resident."""

    def __init__(self, step: GraphedStep) -> None:
        self.step = step
        self.length = 0
        self.spilled: tuple[torch.Tensor, torch.Tensor] | None = None

    def crop(self, max_length: int) -> None:
        super().crop(max_length)
        if self.spilled is not None:
            keys, values = self.spilled
            self.spilled = (keys[:, :, : self.length], values[:, :, : self.length])


class _Graph:
    """One captured pass of ``rows`` tokens: its static inputs and outputs."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.arange(rows, dtype=torch.int64, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None


class GraphedStep:
    """The forward of ``model`` (see :func:`unsupported_reason`) over its own weights (the
    model keeps them; nothing is copied but the rotary tables)."""

    cache_type = GraphedCache

    def __init__(self, model: PreTrainedModel, *, capture: bool | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise SpecOpsError(f"the graphed step cannot run this model: {reason}")
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.capture = graphs_wanted(self.device) if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise SpecOpsError(f"CUDA graphs need a CUDA device, not {self.device}")
        config = model.config
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.scale = self.head_dim**-0.5
        self.limit = int(config.max_position_embeddings)
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.decoder = list(inner.layers)
        self.norm = inner.norm
        self.head = model.get_output_embeddings()
        rotary = inner.rotary_emb
        positions = torch.arange(self.limit, dtype=torch.float32, device=self.device)
        angles = torch.outer(positions, rotary.inv_freq.float().to(self.device))
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        # transformers' convention: the half-angle table repeated, as apply_rotary_pos_emb
        # takes it (rotate_half pairs dimension i with i + head_dim / 2).
        table = torch.cat([angles, angles], dim=-1)
        self.cos = (table.cos() * scaling).to(self.dtype)
        self.sin = (table.sin() * scaling).to(self.dtype)
        self.keys = torch.empty(0, device=self.device)
        self.values = torch.empty(0, device=self.device)
        self._allocate(min(INITIAL_CAPACITY, self.limit))
        self.graphs: dict[int, _Graph] = {}
        self.pool: Any = None
        self._resident: weakref.ReferenceType[GraphedCache] | None = None

    # -- the cache ------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[2])

    def _allocate(self, capacity: int) -> None:
        shape = (len(self.decoder), self.kv_heads, capacity, self.head_dim)
        old_keys, old_values = self.keys, self.values
        self.keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.values = torch.zeros_like(self.keys)
        if old_keys.numel():
            kept = old_keys.shape[2]
            self.keys[:, :, :kept] = old_keys
            self.values[:, :, :kept] = old_values
        self._arange = torch.arange(capacity, device=self.device)  # key positions, for masks

    def new_cache(self) -> GraphedCache:
        return GraphedCache(self)

    def _resident_cache(self) -> GraphedCache | None:
        return self._resident() if self._resident is not None else None

    def _make_resident(self, cache: GraphedCache) -> None:
        if cache.step is not self:
            raise SpecOpsError("a cache of another model's step was passed to this one")
        current = self._resident_cache()
        if current is cache:
            return
        if current is not None and current.length:
            # The request there keeps its prefix (a copy: the buffers are about to change).
            n = current.length
            current.spilled = (self.keys[:, :, :n].clone(), self.values[:, :, :n].clone())
        if cache.spilled is not None:
            keys, values = cache.spilled
            n = keys.shape[2]
            self.keys[:, :, :n] = keys
            self.values[:, :, :n] = values
            cache.spilled = None
        self._resident = weakref.ref(cache)

    def _reserve(self, cache: GraphedCache, rows: int) -> None:
        needed = cache.length + rows
        if needed > self.limit:
            raise SpecOpsError(
                f"a pass to {needed} tokens runs past the model's {self.limit} positions"
            )
        if needed > self.capacity:
            capacity = min(self.limit, max(needed, 2 * self.capacity))
            log.info(
                "graphed step: KV capacity %d -> %d (graphs captured again)",
                self.capacity,
                capacity,
            )
            self._allocate(capacity)
            self.graphs.clear()  # they address the old buffers

    # -- the pass -------------------------------------------------------------------------

    def forward(
        self,
        ids: torch.Tensor,
        caches: Sequence[GraphedCache],
        rows: Sequence[int],
        *,
        keep: int = 0,
        want_hidden: bool = False,
    ) -> LeanOutput:
        """One pass: ``ids`` ``[N]`` packs ``rows[s]`` tokens for each ``caches[s]`` (in
        order), each extending its own cache (one after another: see the module docstring).
        Returns the logits of the last ``keep`` rows (all when 0) and, if ``want_hidden``,
        every row's final hidden state, as :meth:`serving.lean.step.LeanStep.forward`."""
        if len(caches) != len(rows) or sum(rows) != ids.shape[0]:
            raise SpecOpsError(
                f"{len(caches)} caches for row counts {list(rows)} of {ids.shape[0]}"
            )
        logits, hidden = [], []
        start = 0
        for cache, count in zip(caches, rows, strict=True):
            part_logits, part_hidden = self._one(ids[start : start + count], cache)
            logits.append(part_logits)
            hidden.append(part_hidden)
            start += count
        all_logits = logits[0] if len(logits) == 1 else torch.cat(logits)
        kept = all_logits if keep <= 0 else all_logits[-keep:]
        everything = hidden[0] if len(hidden) == 1 else torch.cat(hidden)
        return LeanOutput(logits=kept.float(), hidden=everything if want_hidden else None)

    def _one(self, ids: torch.Tensor, cache: GraphedCache) -> tuple[torch.Tensor, torch.Tensor]:
        rows = int(ids.shape[0])
        self._reserve(cache, rows)
        self._make_resident(cache)
        start = cache.length
        if not self.capture or rows > MAX_GRAPH_ROWS:
            positions = torch.arange(start, start + rows, device=self.device)
            logits, hidden = self._pass(ids, positions)
        else:
            graph = self._graph(rows)
            graph.ids.copy_(ids)
            torch.add(self._arange[:rows], start, out=graph.positions)  # no host copy
            if graph.graph is None:
                self._capture(graph)
            assert graph.graph is not None and graph.logits is not None
            assert graph.hidden is not None
            graph.graph.replay()
            # The graph's outputs are overwritten by its next replay: hand out copies.
            logits, hidden = graph.logits.clone(), graph.hidden.clone()
        cache.length += rows
        return logits, hidden

    def _graph(self, rows: int) -> _Graph:
        graph = self.graphs.get(rows)
        if graph is None:
            graph = self.graphs[rows] = _Graph(rows, self.device)
        return graph

    def _capture(self, graph: _Graph) -> None:
        """Warm up, then capture the pass over the graph's static inputs. The warm-up passes
        write the same keys and values the replay will (the same ids at the same
        positions), so they change nothing a later pass reads."""
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARMUP):
                self._pass(graph.ids, graph.positions)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured, pool=self.pool):
            graph.logits, graph.hidden = self._pass(graph.ids, graph.positions)
        graph.graph = captured
        log.info("graphed step: captured a %d-row pass", graph.ids.shape[0])

    def _pass(
        self, ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward over fixed shapes: ``ids`` and ``positions`` ``[rows]``; the keys and
        values written into the step's buffers at ``positions``. Returns every row's
        logits and final hidden state."""
        rows = ids.shape[0]
        x = F.embedding(ids, self.embed)  # [rows, hidden]
        cos = self.cos[positions][:, None, :]  # [rows, 1, head_dim]
        sin = self.sin[positions][:, None, :]
        # [rows, capacity]: a row attends to every position up to its own.
        mask = self._arange[None, :] <= positions[:, None]
        for index, layer in enumerate(self.decoder):
            attention, mlp = layer.self_attn, layer.mlp
            h = layer.input_layernorm(x)
            if hasattr(attention, "qkv_proj"):
                q, k, v = attention.qkv_proj(h).split(attention.specops_split, dim=-1)
            else:
                q, k, v = attention.q_proj(h), attention.k_proj(h), attention.v_proj(h)
            q = _rotate(q.view(rows, self.heads, self.head_dim), cos, sin)
            k = _rotate(k.view(rows, self.kv_heads, self.head_dim), cos, sin)
            v = v.view(rows, self.kv_heads, self.head_dim)
            self.keys[index].index_copy_(1, positions, k.transpose(0, 1))
            self.values[index].index_copy_(1, positions, v.transpose(0, 1))
            attended = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],  # [1, heads, rows, head_dim]
                self.keys[index][None],  # [1, kv_heads, capacity, head_dim]
                self.values[index][None],
                attn_mask=mask,
                scale=self.scale,
                enable_gqa=self.heads != self.kv_heads,
            )
            x = x + attention.o_proj(attended[0].transpose(0, 1).reshape(rows, -1))
            h = layer.post_attention_layernorm(x)
            if hasattr(mlp, "gate_up_proj"):
                gate, up = mlp.gate_up_proj(h).split(mlp.specops_split, dim=-1)
            else:
                gate, up = mlp.gate_proj(h), mlp.up_proj(h)
            x = x + mlp.down_proj(F.silu(gate) * up)
        hidden = self.norm(x)
        return self.head(hidden), hidden


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``apply_rotary_pos_emb`` for one tensor ``[rows, heads, head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
