"""torch's elastic rendezvous names each event it records after the method that records it, found
with `inspect.stack()` (torch.distributed.elastic.rendezvous.dynamic_rendezvous.get_method_name).
That builds every frame's source context, searching `sys.modules` for each frame (cpython#92041):
its cost grows with the stack's depth and the modules loaded, a second and more a launch from a
process deep in a program with many modules (a sweep, a notebook, a test session). The same name is
read from the frame itself here."""
from __future__ import annotations

import sys

from torch.distributed.elastic.rendezvous import dynamic_rendezvous


def method_name(depth: int = 2) -> str:
    """The name of the function `depth` frames above this one (torch's get_method_name: 1 is the
    caller, 2 the caller's caller), or torch's "no_method_name" where the stack is shallower."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


def name_rendezvous_events_cheaply() -> None:
    """Swap torch's stack-building get_method_name for `method_name` (where torch still has it)."""
    if callable(getattr(dynamic_rendezvous, "get_method_name", None)):
        dynamic_rendezvous.get_method_name = method_name
