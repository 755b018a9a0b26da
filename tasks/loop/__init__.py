"""The closed loop's steps as plain typed functions (``steps``), their Prefect task wrappers
(``prefect_tasks``; the flows in ``flows/`` only wire those), per-target export and
promotion, and the main job's report.

May import: ``registry``, ``serving``, ``tasks.data``, ``tasks.train``, ``tasks.evaluate``.
"""
