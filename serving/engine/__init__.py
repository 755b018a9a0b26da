"""The engine: everything on the path from a prompt's token ids to verified tokens.

``decoder`` (one request's loop), ``step`` (one pure speculative step) and ``verify`` (the
lossless acceptance rule), the samplers (``sampling``), draft-length policies (``policy``),
KV-cache bookkeeping (``kv``), constrained and relaxed verification, per-token features
and detailed records, the metric definitions, the drafters and their kinds table
(``drafters/``), batched verification (``batch/``), the cascade (``cascade/``) and its
acceptance predictor (``predictor``). Nothing here knows HTTP, gRPC, the registry or files
beyond a draft package's.

This package's ``__init__`` imports nothing, so a drafter spec is checked (and the CLI's
help built) without importing torch.
"""
