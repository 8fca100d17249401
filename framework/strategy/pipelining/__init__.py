"""Helpers of the pipeline strategy (strategy=pipeline): torch's schedules and their rules."""
