"""A discrete-event simulator (SimPy) for planning speculative-decoding deployments: how
many targets of which kind, which router, what batching window, for a given arrival rate
and drafter. ``config`` is the typed scenario, ``model`` the simulation, ``report`` the
figures drawn from its event log, ``acceptance`` a drafter's acceptance by position from
collected records, ``sweep`` a scenario over draft clients and targets (table, plot,
MLflow runs through a ``log_report`` callable); docs/simulator.md says what the model
assumes.

May import: ``serving``.
"""
