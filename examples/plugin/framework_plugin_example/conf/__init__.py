"""This package's config tree: one folder per framework group (entry point framework.conf)."""
