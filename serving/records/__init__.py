"""What serving leaves behind for the loop: the request record (schema) built from the
engine's detailed output, and the append-only store its parts are written to. Here, below
``tasks/``, so that the server's capture and the data stage's collection share one schema
and one writer without an upward import.
"""
