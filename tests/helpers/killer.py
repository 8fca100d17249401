"""Ways for a real run to die abruptly, at a chosen moment, for the fault-tolerance tests."""
import os
import signal
import time
from pathlib import Path

from framework.callbacks.base import Callback
from framework.checkpoint_io.torch import TorchCheckpointIO


class KillRankOnce(Callback):
    """SIGKILLs the process of `rank` after optimizer step `step`, in the first attempt only."""

    def __init__(self, rank: int = 1, step: int = 5):
        self.rank, self.step = rank, step

    def on_train_step_end(self, loop) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and loop.strategy.global_rank == self.rank and loop.state.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class DyingCheckpointIO(TorchCheckpointIO):
    """Writes normally until the `die_at_save`-th file, of which it writes half a temp file (as
    torch.save would when killed) and then SIGKILLs its own process."""

    def __init__(self, die_at_save: int = 5, **kwargs):
        super().__init__(**kwargs)
        self.die_at_save = die_at_save
        self.saves = 0

    def save(self, obj, path) -> None:
        self.saves += 1
        if self.saves == self.die_at_save:
            path = Path(path)
            with open(path.with_name(f".{path.name}.tmp-{os.getpid()}"), "wb") as f:
                f.write(b"PK\x03\x04 half of a zip")
                f.flush()
                os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        super().save(obj, path)


class KillReplicaGroupOnce(Callback):
    """fault_tolerance=torchft: SIGKILLs every process of replica group `group` after step `step`,
    in the group's first life only (its run directory keeps a mark), so the command restarts it."""

    def __init__(self, group: int = 1, step: int = 10):
        self.group, self.step = group, step

    def on_train_step_end(self, loop) -> None:
        mark = loop.output_dir / ".killed-once"
        if loop.replicas.group == self.group and loop.state.step == self.step and not mark.exists():
            loop.strategy.barrier()
            if loop.strategy.is_global_zero:
                mark.touch()
            loop.strategy.barrier()
            os.kill(os.getpid(), signal.SIGKILL)


class PaceWhileAlone(Callback):
    """Sleeps `seconds` after each step while fewer groups than there are take part, so the groups
    still alive keep stepping (alone) until a restarted one has rejoined, on any machine's speed;
    at most `limit_s` in all."""

    def __init__(self, seconds: float = 0.25, limit_s: float = 120.0):
        self.seconds, self.left = seconds, limit_s

    def on_train_step_end(self, loop) -> None:
        if loop.replicas.participants < loop.replicas.replica_groups and self.left > 0:
            time.sleep(self.seconds)
            self.left -= self.seconds


class RejoinMidRollout(Callback):
    """fault_tolerance=torchft with task.num_iterations > 1: a restarted group rejoins between two
    optimizer steps of one rollout. The restarted group marks its run directory as it starts
    reading its first batch (just before it asks for its first quorum); a group going on alone
    waits, after a step that leaves iterations of its rollout to train, until a peer's mark is
    there (at most `limit_s`), then `seconds` more, so the next quorum (that rollout's next
    iteration) has the restarted group in it, on any machine's speed."""

    MARK = ".reading-again"

    def __init__(self, seconds: float = 2.0, limit_s: float = 300.0):
        self.seconds, self.limit_s = seconds, limit_s

    def on_fit_start(self, loop) -> None:
        if not (loop.output_dir / ".killed-once").exists():
            return  # its first life
        sampler, mark = loop.train_loader.sampler, loop.output_dir / self.MARK
        dealt = type(sampler)

        class Marked(dealt):
            def __iter__(self):
                mark.touch()
                yield from dealt.__iter__(self)

        sampler.__class__ = Marked

    def on_train_step_end(self, loop) -> None:
        if loop.rollout_left is None or loop.replicas.participants >= loop.replicas.replica_groups:
            return
        marks = [folder / self.MARK for folder in loop.output_dir.parent.glob("replica_*") if folder != loop.output_dir]
        deadline = time.monotonic() + self.limit_s
        while not any(m.exists() for m in marks) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(self.seconds)


class NanInGroupOnce(Callback):
    """fault_tolerance=torchft: replica group `group`'s model gives NaN logits in the training
    forward of step `step` (its own share of that step's batch), in its first life only."""

    def __init__(self, group: int = 1, step: int = 5):
        self.group, self.step = group, step

    def on_fit_start(self, loop) -> None:
        if loop.replicas.group != self.group:
            return

        def poison(module, args, output):
            if module.training and loop.state.step + 1 == self.step:
                return output * float("nan")
            return None

        loop.strategy.unwrap(loop.model).register_forward_hook(poison)


class RecordSamples(Callback):
    """Writes every sample index the training sampler deals to this process, to
    <run dir>/samples/rank<r>.txt (appended to by every life of the group): a line `start <step>
    <epoch> <position>` each time the epoch's order is dealt again (a fresh start, a resume, a heal),
    then the indices one a line. Prefetching loaders draw a few indices past the last step trained."""

    def on_fit_start(self, loop) -> None:
        sampler = loop.train_loader.sampler
        folder = loop.output_dir / "samples"
        folder.mkdir(exist_ok=True)
        path = folder / f"rank{loop.strategy.global_rank}.txt"
        dealt = type(sampler)

        class Recorded(dealt):
            def __iter__(self):
                with open(path, "a") as out:
                    out.write(f"start {loop.state.step} {self.epoch} {self.start}\n")
                    for index in dealt.__iter__(self):
                        out.write(f"{index}\n")
                        out.flush()
                        yield index

        sampler.__class__ = Recorded
        (folder / "sampler.json").write_text(__import__("json").dumps(
            {"length": sampler.length, "replicas": sampler.replicas, "seed": sampler.seed, "shuffle": sampler.shuffle}))


def dealt_runs(path) -> list[tuple[tuple[int, int, int], list[int]]]:
    """RecordSamples' file as ((step, epoch, position), indices) per time the order was dealt."""
    runs: list = []
    for line in Path(path).read_text().splitlines():
        if line.startswith("start "):
            runs.append((tuple(int(x) for x in line.split()[1:]), []))
        elif line:
            runs[-1][1].append(int(line))
    return runs
