"""The data stage: real workloads (ShareGPT, HumanEval, grounded edits) split into train and
held-out prompts, collection of request records through the engine, their validation
(Great Expectations, quarantine with reasons), the training dataset (failures + replay),
rolling acceptance, DVC versioning and the pipeline's typed parameters.

May import: ``serving`` (the engine, the record schema and store). Nothing else of
``tasks``.
"""
