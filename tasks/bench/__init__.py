"""Benchmarks and research measurements: each writes a results file (JSON, table, plot)
that a page of ``docs/`` reports, with the command that reproduces it. The side-by-side
benchmark against Hugging Face, pass-cost profiles, the suffix-draft study and the
learning curves of the draft designs.

May import: ``serving``, ``tasks.data``, ``tasks.train``, ``tasks.evaluate``.
"""
