"""Distributed speculative decoding over gRPC (docs/distributed.md).

A draft client proposes blocks of tokens with any specops drafter; a target server verifies
them against each session's own KV cache, in one packed pass for every session waiting
(:mod:`serving.engine.batch`), and replies with what it kept. A *fused* session runs the drafter on
the server instead, over the same protocol. ``proto/`` holds the protocol and its generated
modules; ``sessions`` the server's per-session state and limits; ``scheduler`` the thread
that owns the target; ``server`` the gRPC service; ``client`` the draft client.
"""
