"""The applier surface's written contract (framework/strategy/mesh/applier.py): every hook says how
the mesh strategy combines it over a layout's appliers, and a hook one applier alone may implement
(the schedule that runs a step itself) claimed by two is refused when the layout's appliers are chosen."""
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
        def schedule(self):
            return None

    class AnotherSchedule(Applier):
        def schedule(self):
            return None

    with pytest.raises(ConfigError, match=r"appliers OwnSchedule and AnotherSchedule both implement `schedule`"):
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


def test_appliers_are_given_a_placement_not_the_strategy():
    """An applier reaches the run through its Placement (framework/strategy/mesh/placement.py) and
    its siblings through its model's layout: no applier file names the strategy's private parts."""
    import re
    from pathlib import Path

    mesh = Path(__file__).resolve().parents[2] / "framework" / "strategy" / "mesh"
    for path in [*mesh.glob("*.py"), *mesh.glob("pipeline/*.py")]:
        if path.name in ("strategy.py", "placement.py"):
            continue
        assert not re.search(r"self\.strategy\b|\bs\._say\(", path.read_text()), path


def test_a_second_model_is_placed_through_a_layout_of_its_own():
    """place_frozen builds the frozen model through a new ModelLayout: the trained model's layout
    (its appliers and their state, the initialisation log it has not replayed yet) is untouched."""
    import torch.distributed as dist

    from framework.models.gpt import GPT
    from framework.strategy.fsdp import FSDPStrategy

    def factory():
        return GPT(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        strategy = FSDPStrategy()
        trained = strategy.model_layout()
        appliers = list(trained.appliers)
        model = strategy.build_model(factory)  # built, not yet wrapped: its log waits in its layout
        log = trained.init_log
        frozen = strategy.place_frozen(factory)
        assert strategy.model_layout() is trained and trained.appliers == appliers and trained.init_log is log
        assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())
        strategy.wrap_model(model)
        assert trained.init_log is None and not any(p.is_meta for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_the_schedule_side_of_the_surface_is_the_pipelines_alone():
    """What only a schedule answers (framework/strategy/mesh/schedule.py) is not an applier hook, and
    of the built-in appliers only the pipeline's provides a schedule."""
    from framework.strategy.mesh.schedule import Schedule

    sides = {name for name in vars(Schedule) if not name.startswith("_")}
    assert sides >= {"roots", "materialise", "forward_backward", "counted", "norm_group", "merged_model_state",
                     "load_model_state", "optimizer_state_to_load"}
    assert not sides & set(COMBINED)
    every = [kind.__new__(kind) for kind in ORDER]
    assert [type(a).__name__ for a in implementers(every, "schedule")] == ["PipelineApplier"]
