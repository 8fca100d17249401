"""What `framework plan` (and a run's out-of-memory advice) estimates before anything runs: bytes
per rank for the model states under each strategy (memory)."""
