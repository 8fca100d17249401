"""The applier surface's written contract (framework/strategy/mesh/applier.py): every hook says how
the mesh strategy combines it over a layout's appliers, and a hook one applier alone may implement
(a schedule, a checkpoint merge) claimed by two is refused when the layout's appliers are chosen."""
from __future__ import annotations

import pytest

from framework.errors import ConfigError
from framework.strategy.mesh.applier import COMBINED, Applier, checked, implementers
from framework.strategy.mesh.strategy import ORDER


def test_every_hook_has_its_combination_rule():
    hooks = {name for name in vars(Applier) if not name.startswith("_") and name != "wanted"}
    assert hooks == set(COMBINED)
    assert set(COMBINED.values()) <= {"each", "fold", "first", "any", "union", "concat", "product", "one"}


def test_two_appliers_claiming_a_hook_only_one_may_are_refused():
    class OwnSchedule(Applier):
        def forward_backward(self, model, task, batch, group, scale, loss_of):
            return None

    class AnotherSchedule(Applier):
        def forward_backward(self, model, task, batch, group, scale, loss_of):
            return None

    with pytest.raises(ConfigError, match=r"appliers OwnSchedule and AnotherSchedule both implement `forward_backward`"):
        checked([OwnSchedule(None, None), AnotherSchedule(None, None)])
    assert len(checked([OwnSchedule(None, None), Applier(None, None)])) == 2  # one claiming it: fine


def test_the_built_in_appliers_never_claim_the_same_sole_hook():
    """All of ORDER at once (more than any layout has): no two implement a hook of the rule "one"."""
    every = [kind.__new__(kind) for kind in ORDER]
    assert checked(every) == every
    owned = {hook: [type(a).__name__ for a in implementers(every, hook)] for hook, rule in COMBINED.items()
             if rule == "one"}
    assert all(len(names) <= 1 for names in owned.values()), owned


def test_every_ability_flag_says_whether_it_is_a_permission_or_a_requirement():
    """A layout's abilities combine its parts' by each flag's declared kind, not by its default."""
    from dataclasses import fields

    from framework.strategy.abilities import Abilities

    flags = [f for f in fields(Abilities) if isinstance(f.default, bool)]
    assert flags and all(f.metadata.get("kind") in ("permission", "requirement") for f in flags)
    plain, engine, stages = Abilities(), Abilities(compile=False), Abilities(pipeline_stages=True)
    both = plain.combined([engine, stages])
    assert both.compile is False and both.pipeline_stages is True  # taken away by one; imposed by one
    assert plain.combined([plain]) == plain
