"""Datasets the framework ships, the DataModule base, and the loaders built from them."""
