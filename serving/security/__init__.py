"""Who may call the servers and what their capture keeps: API keys, request limits,
redaction of captured traffic, and secrets kept out of logs (torch-free)."""
