"""The one walker over `_target_` nodes, for OmegaConf nodes and plain containers alike (the
trust check walks plain containers, the signature check OmegaConf nodes)."""
from __future__ import annotations

from typing import Any, Iterator

from omegaconf import DictConfig, ListConfig


def _children(node: Any) -> list[tuple[str, Any]]:
    if isinstance(node, DictConfig):  # _get_node: no interpolation is resolved on the way
        return [(str(k), node._get_node(k)) for k in node.keys()]
    if isinstance(node, dict):
        return [(str(k), v) for k, v in node.items()]
    if isinstance(node, ListConfig):
        return [(f"[{i}]", node._get_node(i)) for i in range(len(node))]
    if isinstance(node, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(node)]
    return []


def target_nodes(node: Any, key: str = "", skip: frozenset[str] | set[str] = frozenset()) -> Iterator[tuple[str, Any]]:
    """(full key, node) for every node holding a `_target_` under `node`, not descending into the
    keys in `skip` (e.g. 'callbacks.checkpoint', or 'trainer.models[0]')."""
    if isinstance(node, (dict, DictConfig)) and "_target_" in node:
        yield key, node
    for child, value in _children(node):
        if child in skip:
            continue
        yield from target_nodes(value, f"{key}{child}" if child.startswith("[") or not key else f"{key}.{child}",
                                skip)
