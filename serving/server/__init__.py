"""The OpenAI-compatible HTTP server: app and schemas, the scheduler that runs model calls
on worker threads, champion sources and hot swap, traffic capture into the record store,
and Prometheus metrics. Its one import from outside ``serving`` is the champion lookup of
``registry.champion``."""
