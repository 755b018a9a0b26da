"""The closed loop's steps as plain typed functions, one module per family of steps
(``data_steps``, ``champion_steps``, ``training_steps``, ``evaluation_steps``,
``registry_steps``; the target they run on in ``targets``), their Prefect task wrappers,
one line each, in the matching ``*_tasks`` modules (the flows in ``flows/`` only wire
those), per-target export and promotion, and the main job's report.

May import: ``registry``, ``serving``, ``tasks.data``, ``tasks.train``, ``tasks.evaluate``.
"""
