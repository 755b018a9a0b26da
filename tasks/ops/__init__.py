"""Operating a server: starting one as a child process and load-testing it with the
official ``openai`` client.

May import: ``serving``, ``tasks.data``.
"""
