"""task group: how a batch becomes a loss and metrics."""
