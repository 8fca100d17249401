"""The config groups the framework knows by name (one place; everything else reads them here)."""

# The plugin groups: built into objects (framework/plugins.py); the strategy is composed of the
# first five, fault_tolerance stands beside it (the loop agrees each step with the replica groups).
PLUGIN_GROUPS = ("accelerator", "strategy", "precision", "checkpoint_io", "cluster", "fault_tolerance")
# Groups chosen as lists (`logger=[csv,tensorboard]`); each option is keyed by its own name, and
# `none`/`null` is the empty list.
LIST_GROUPS = ("logger", "callbacks")
# Groups whose option names look like numbers (`precision=16`), which Hydra's grammar misreads.
GROUPS_WITH_NUMERIC_OPTIONS = ("precision",)
