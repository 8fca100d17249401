"""framework/launch/rendezvous_names.py: torch's rendezvous events keep their names, read from the
frame instead of from `inspect.stack()`."""
from __future__ import annotations

import inspect

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from framework.launch.rendezvous_names import method_name, name_rendezvous_events_cheaply


def torchs_method_name(depth=2):  # torch 2.13's get_method_name, as written there
    if len(inspect.stack()) > depth:
        return inspect.stack()[depth].function
    return "no_method_name"


def test_the_name_is_the_one_torchs_stack_walk_gives():
    def _record():  # as torch's handlers call it: the event is named after _record's caller
        return method_name(), torchs_method_name(), method_name(1), method_name(10_000)

    def next_rendezvous():
        return _record()

    ours, torchs, caller, beyond = next_rendezvous()
    assert ours == torchs == "next_rendezvous" and caller == "_record" and beyond == "no_method_name"


def test_the_launch_installs_it_in_place_of_torchs(monkeypatch):
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", dynamic_rendezvous.get_method_name)
    name_rendezvous_events_cheaply()
    assert dynamic_rendezvous.get_method_name is method_name
