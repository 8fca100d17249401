"""Fault tolerance (conf/fault_tolerance): replica groups that go on without a dead peer and heal from a live one."""
