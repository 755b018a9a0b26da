"""The product's measurement commands, each writing a results file (JSON, table, plot) that
a page of ``docs/`` reports with the command that reproduces it: ``specops bench`` (against
Hugging Face and llama.cpp, with physical limits), ``specops profile`` (pass costs),
``specops distributed bench``, ``specops bench-skeleton`` and ``specops quality`` (what the
quantised targets cost in quality). Finished studies live outside the product, in
``benchmarks/``; the interleaved timing loop is :mod:`tasks.evaluate.interleave`.

May import: ``serving``, ``tasks.data``, ``tasks.train``, ``tasks.evaluate``.
"""
