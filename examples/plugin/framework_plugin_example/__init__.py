"""An example plugin package: a DDP subclass, an fsspec checkpoint mirror and a cluster
environment, found by the framework through entry points (see pyproject.toml)."""
