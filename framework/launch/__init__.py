"""Launching: run the worker here, or join processes created outside."""
