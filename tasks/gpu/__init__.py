"""The GPU run kit: built here (kit), run there (there, steps), ingested back (ingest)."""
