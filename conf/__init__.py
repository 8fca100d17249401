"""The framework's config tree, installed as the package `framework.conf` (read by Hydra as pkg://framework.conf)."""
