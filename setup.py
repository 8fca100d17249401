"""Packages and data; the project's metadata is in pyproject.toml.

conf/ and recipes/ stay at the top of the source tree (the config tree mirrors framework/), and
are installed as the packages `framework.conf` and `framework.recipes`, so an installed framework
finds them with `pkg://framework.conf` (hydra_plugins/framework_searchpath).
"""
from setuptools import find_namespace_packages, setup

SHIPPED_TREES = {"framework.conf": "conf", "framework.recipes": "recipes"}

setup(
    packages=find_namespace_packages(include=["framework", "framework.*", "hydra_plugins", "hydra_plugins.*"])
    + list(SHIPPED_TREES),
    package_dir=SHIPPED_TREES,
    package_data={**{name: ["*.yaml", "**/*.yaml"] for name in SHIPPED_TREES},
                  "framework.data": ["examples/*.jsonl"]},  # the example data (framework/data/examples)
)
