"""Batched speculative decoding: many requests' draft blocks verified in one target pass.

:mod:`serving.engine.batch.ragged` packs the blocks into one sequence and attends each request
against its own KV cache; :mod:`serving.engine.batch.plan` decides each request's draft length
for the batch as a whole; :mod:`serving.engine.batch.batch` steps the requests that share it.
"""
