"""specops: speculative decoding in production. The command line lives in specops.cli."""
