"""One source of truth for the loop's settings: the schema's defaults (what a key left out of every
YAML gets) are the values conf/trainer/default.yaml gives, and the root's are conf/train.yaml's."""
from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from framework.config import schema
from tests.conftest import ROOT


def _defaults(cls) -> dict:
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


def test_every_trainer_field_has_the_default_of_conf_trainer_default_yaml():
    yaml = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "trainer" / "default.yaml"))
    schema_defaults = _defaults(schema.TrainerConfig)
    assert set(yaml) == set(schema_defaults), "conf/trainer/default.yaml and TrainerConfig name other fields"
    differ = {k: (schema_defaults[k], yaml[k]) for k in yaml if yaml[k] != schema_defaults[k]}
    assert not differ, f"schema default vs conf/trainer/default.yaml: {differ}"


def test_the_roots_plain_keys_have_the_default_of_conf_train_yaml():
    yaml = OmegaConf.load(ROOT / "conf" / "train.yaml")
    schema_defaults = _defaults(schema.TrainConfig)
    for key in ("devices", "num_nodes", "seed", "ckpt_path", "resume", "debug"):
        assert yaml[key] == schema_defaults[key], key
