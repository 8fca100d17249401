"""framework.registry: options registered from code, with default arguments."""
from __future__ import annotations

import pytest

from framework.errors import ConfigError
from framework.registry import REGISTERED, register, registered_options
from tests.conftest import compose_cfg


@pytest.fixture(autouse=True)
def clean_registry():
    before = dict(REGISTERED)
    yield
    REGISTERED.clear()
    REGISTERED.update(before)


def test_a_registered_option_composes_with_its_defaults():
    register("strategy", "ddp_tiny_buckets", "framework.strategy.ddp.DDPStrategy", bucket_cap_mb=0.5)
    assert "ddp_tiny_buckets" in registered_options("strategy")
    cfg = compose_cfg(["strategy=ddp_tiny_buckets", "strategy.static_graph=true"])
    assert cfg.strategy._target_ == "framework.strategy.ddp.DDPStrategy"
    assert cfg.strategy.bucket_cap_mb == 0.5 and cfg.strategy.static_graph is True


def test_a_list_group_option_is_keyed_by_its_name():
    register("logger", "csv_two", "framework.loggers.csv.CSVLogger", filename="two.csv")
    cfg = compose_cfg(["logger=[csv,csv_two]"])
    assert set(cfg.logger) == {"csv", "csv_two"} and cfg.logger.csv_two.filename == "two.csv"


def test_registering_a_name_twice_differently_is_refused():
    from framework.strategy.ddp import DDPStrategy

    register("strategy", "mine", DDPStrategy, bucket_cap_mb=1.0)
    register("strategy", "mine", DDPStrategy, bucket_cap_mb=1.0)  # the same again is fine
    with pytest.raises(ConfigError, match="strategy=mine is registered twice"):
        register("strategy", "mine", DDPStrategy, bucket_cap_mb=2.0)
