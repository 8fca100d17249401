"""The harness's tasks `framework eval` is asked for, checked before a model is loaded: the YAML
files of --include-path all parse (the harness skips one that does not, without a word), the
names exist, and the local data files the chosen tasks name exist."""
from __future__ import annotations

from pathlib import Path

import yaml

from framework.errors import ConfigError


class _AnyTag(yaml.SafeLoader):
    """YAML with the harness's tags (`!function utils.process_docs`) read as plain values."""


_AnyTag.add_multi_constructor("!", lambda loader, suffix, node: None)


def unreadable_task_files(path: Path) -> list[str]:
    """Each YAML file under `path` that does not parse, with where and why (the harness skips such a
    file without a word, and its task is then 'no task')."""
    found = []
    for file in sorted(path.rglob("*.yaml")):
        try:
            yaml.load(file.read_text(), Loader=_AnyTag)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            found.append(f"{file}{where}: {getattr(err, 'problem', None) or err}")
    return found


def task_manager(TaskManager, include_path: str | None):
    """The harness's task registry, with the YAML task files of `include_path` (checked)."""
    if include_path is None:
        return TaskManager()
    path = Path(include_path).expanduser()
    if not path.is_dir():
        raise ConfigError(f"--include-path {include_path}: no such directory; give the directory of your YAML task "
                          "files.")
    if not any(path.rglob("*.yaml")):
        raise ConfigError(f"--include-path {include_path}: holds no YAML task file (*.yaml, the harness's task "
                          "format: task, dataset_path, output_type, doc_to_text, ...); add one, or drop the option.")
    broken = unreadable_task_files(path)
    if broken:
        raise ConfigError(f"--include-path {include_path}: a task file is not valid YAML ({'; '.join(broken)}); "
                          "mend it (the harness would skip it and its task would not be found).")
    return TaskManager(include_path=str(path))


def missing_data_files(manager, names: list[str]) -> list[str]:
    """Each local data file a chosen task's YAML names that does not exist (`dataset_kwargs:
    data_files:`, a path without wildcards or a scheme), as 'task (its file): path'."""
    missing = []
    for name in names:
        entry = manager.task_index.get(name)
        cfg = getattr(entry, "cfg", None) or {}
        files = (cfg.get("dataset_kwargs") or {}).get("data_files")
        values = files.values() if isinstance(files, dict) else [files]
        for value in values:
            for file in value if isinstance(value, list) else [value]:
                if isinstance(file, str) and "://" not in file and not any(c in file for c in "*?[") \
                        and not Path(file).expanduser().exists():
                    missing.append(f"{name} ({getattr(entry, 'yaml_path', '?')}): {file}")
    return missing


def chosen_tasks(manager, tasks: str, include_path: str | None) -> list[str]:
    names = [name.strip() for name in tasks.split(",") if name.strip()]
    known = set(manager.all_tasks)
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        raise ConfigError(f"--tasks {tasks}: {', '.join(unknown) or 'no task'} is no task of the harness"
                          f"{' nor of --include-path ' + include_path if include_path else ''}; list them with "
                          "`lm-eval ls tasks` (with --include_path DIR for local files), or name a local task "
                          "file's `task:`.")
    missing = missing_data_files(manager, names)
    if missing:
        raise ConfigError(f"--tasks {tasks}: a task's data file does not exist ({'; '.join(missing)}); fix "
                          "`dataset_kwargs: data_files:` in the task's YAML file (a relative path is read from the "
                          "directory you run in).")
    return names
