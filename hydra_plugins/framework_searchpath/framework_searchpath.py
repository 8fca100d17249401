"""Puts the framework's config tree, and those of installed plugin packages, on every Hydra
app's search path.

Hydra discovers this module in the `hydra_plugins` namespace package, so a recipe anywhere on
disk can say `defaults: [train, ...]` and find the framework's groups, whether the framework is
a source checkout, an editable install or a wheel (`pkg://framework.conf`). Packages that declare
a `framework.conf` entry point (framework/registry.py) come after it.
"""
from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class FrameworkSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from framework.registry import load_plugins, plugin_conf_packages

        load_plugins()  # options registered from code (ConfigStore) exist before composing

        search_path.append(provider="framework", path="pkg://framework.conf")
        # built-in recipes can build on each other, wherever a copy of one is run from
        search_path.append(provider="framework-recipes", path="pkg://framework.recipes")
        for dist, package in plugin_conf_packages().items():
            search_path.append(provider=dist, path=f"pkg://{package}")
