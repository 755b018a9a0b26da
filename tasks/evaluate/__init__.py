"""The evaluation stage: challengers against the champion and plain decoding on held-out
prompts (interleaved, lossless check), promotion gates, replayed (offline) acceptance of
trained drafts, exports to other backends' formats and evaluation per hardware target.

May import: ``serving``, ``tasks.data``, ``tasks.train``.
"""
