"""Reading the sharded layout: model and optimizer state as one torch.distributed.checkpoint (DCP)
directory, `state/`, written by checkpoint_io=dcp (each rank its own shards).

Any strategy at any world size reads it: DCP reshards on load. A strategy that hands out sharded
state reads straight into its own shards (`load_into`); one that works with full tensors reads
the whole state on every rank (`read_full`), as `framework convert` does in a single process.

DCP itself unpickles two things without restriction: the `.metadata` file and non-tensor values
(optimizer hyperparameters, parameter-name lists). Both are read here through restricted loaders,
so a checkpoint holding a pickled callable is refused like any other unsafe checkpoint.
"""
from __future__ import annotations

import importlib
import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from framework.errors import CheckpointError

STATE_DIR = "state"
METADATA_FILE = ".metadata"

# DCP warns on every single-process save/load that it assumes a single process: that is our intent.
warnings.filterwarnings("ignore", message=r"torch\.distributed is .*assuming the intent is to (save|load) in a single")

# Everything a DCP .metadata file may name: DCP's own records and a few torch/stdlib types.
_SAFE_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_SAFE_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                 ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
                 ("pathlib", "PureWindowsPath"), ("builtins", "set"), ("builtins", "frozenset")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _SAFE_MODULES and isinstance(getattr(importlib.import_module(module), name, None), type):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise CheckpointError(f"it names {module}.{name}, which a DCP metadata file never holds")


def read_metadata(state_dir: Path):
    """The DCP Metadata of `state_dir`, unpickled with only DCP's own classes allowed."""
    path = Path(state_dir) / METADATA_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: {state_dir} is not a complete DCP checkpoint.")
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(f).load()
    except CheckpointError as err:
        raise CheckpointError(f"{path} is refused because loading it could run code: {err}.") from err
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, IndexError) as err:
        raise CheckpointError(f"{path} is truncated or corrupt ({type(err).__name__}: {err}). "
                              "Use an earlier checkpoint.") from err


def _reader(state_dir: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        """DCP's file reader with the metadata read through the restricted unpickler."""

        def read_metadata(self, *args, **kwargs):
            metadata = read_metadata(state_dir)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = getattr(self, "load_id", None)
            return metadata

    return SafeFileSystemReader(str(state_dir))


def _planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        """DCP's default planner, but non-tensor values load with weights_only=True."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as err:
                raise CheckpointError(f"the value of '{fqn}' holds objects other than tensors and plain values "
                                      f"(for example a pickled class or function), which are refused because "
                                      f"loading them could run code: {str(err).splitlines()[0]}") from err
            if self.flatten_state_dict:
                _set_path(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return SafeLoadPlanner()


def _set_path(root: Any, path: tuple, value: Any) -> None:
    """Set root[path[0]][path[1]]... = value, creating dicts (or lists, for integer keys)."""
    node = root
    for key, following in zip(path[:-1], path[1:]):
        fresh = [] if isinstance(following, int) else {}
        if isinstance(node, list):
            node.extend([None] * (key + 1 - len(node)))
            if node[key] is None:
                node[key] = fresh
        elif key not in node:
            node[key] = fresh
        node = node[key]
    if isinstance(node, list):
        node.extend([None] * (path[-1] + 1 - len(node)))
    node[path[-1]] = value


def _load(state: dict, state_dir: Path, process_group=None) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    distributed = dist.is_available() and dist.is_initialized()
    try:
        dcp.load(state, storage_reader=_reader(Path(state_dir)), planner=_planner(), process_group=process_group,
                 no_dist=not distributed)
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as err:  # DCP gathers each rank's failure into one
        cause = root_cause(err)
        if isinstance(cause, CheckpointError):
            raise cause from err
        raise CheckpointError(f"{state_dir} could not be read into this model/optimizer ({describe(cause)}). "
                              "It is truncated, or was saved from a different config (see meta.json).") from err


def root_cause(err: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's CheckpointException (else `err` itself)."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        inner = first[0] if isinstance(first, tuple) else first
        if isinstance(inner, BaseException):
            return root_cause(inner)
    return err


def describe(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def load_into(template: dict, state_dir: Path, process_group=None) -> dict:
    """Collective: fill `template` (this rank's tensors, plain or DTensor shards) in place from
    the checkpoint, resharding as needed. Returns `template`."""
    _load(template, state_dir, process_group)
    return template


def full_template(state_dir: Path, prefixes: tuple[str, ...] | None = None) -> dict:
    """A nested state (same shape as what was saved) of empty full-size tensors, one per saved
    tensor, and placeholders for plain values, built from the checkpoint's metadata."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = read_metadata(state_dir)
    paths = metadata.planner_data or {}
    template: dict = {}
    for key, entry in metadata.state_dict_metadata.items():
        path = tuple(paths.get(key, (key,)))
        if prefixes is not None and path[0] not in prefixes:
            continue
        if isinstance(entry, TensorStorageMetadata):
            value = torch.empty(entry.size, dtype=entry.properties.dtype)
        else:
            value = None
        _set_path(template, path, value)
    return template


def saved_subtree(state_dir: Path, prefix: tuple) -> Any:
    """The part of what was saved under `prefix` (e.g. ("optimizer", "param_groups")), as
    full_template builds it: placeholders for plain values, empty tensors; None where nothing was."""
    tree = full_template(Path(state_dir), prefix[:1])
    for key in prefix:
        if not isinstance(tree, (dict, list)) or (isinstance(tree, dict) and key not in tree):
            return None
        tree = tree[key]
    return tree


def read_full(state_dir: Path, prefixes: tuple[str, ...] | None = None, process_group=None) -> dict:
    """The whole saved state as full tensors on this rank ({"model": ..., "optimizer": ...}), or
    only the top-level entries named in `prefixes`. Collective when a process group is up."""
    template = full_template(Path(state_dir), prefixes)
    _load(template, state_dir, process_group)
    return template
