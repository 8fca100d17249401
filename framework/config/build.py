"""Instantiate a `_target_` node, turning construction errors into errors that name the key."""
from __future__ import annotations

from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from framework.config.trust import untrusted
from framework.errors import ConfigError, UserError


def build(node: Any, key: str, **kwargs) -> Any:
    """`hydra.utils.instantiate(node, **kwargs)` with plain Python containers for arguments.
    A user error raised while building is passed on; a TypeError or ValueError (arguments the
    callable rejects) or an ImportError (a package the option needs) becomes a ConfigError naming
    `key`."""
    if not isinstance(node, DictConfig):
        node = OmegaConf.create(node)
    trusted(node, key)
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as err:
        cause = err.__cause__ or err
        if isinstance(cause, UserError):
            raise cause from None
        if isinstance(cause, (TypeError, ValueError)):
            raise ConfigError(f"{key}: building {node.get('_target_')} failed: {cause}") from err
        if isinstance(cause, ImportError):  # an option that needs a package this machine lacks
            raise ConfigError(f"{key}: building {node.get('_target_')} needs what is not installed here: "
                              f"{str(cause).splitlines()[0]}. Install it, or choose another {key}.") from err
        raise


def trusted(node: DictConfig, key: str) -> None:
    """Every target in `node` must be trusted (checked for the whole config before launch; again
    here, where code is actually imported and called, for configs built by other routes)."""
    problems = untrusted(OmegaConf.to_container(node, resolve=False), key)
    if problems:
        raise ConfigError(problems[0])


def guarded(fn, key: str):
    """Wrap a partial built from `key` so that arguments it rejects when finally called
    (a partial optimizer gets its parameters late) become a ConfigError naming `key`."""

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{key}: calling {getattr(fn, 'func', fn)} failed: {err}") from err

    return call
