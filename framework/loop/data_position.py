"""Where training stands in its data, kept in samples of the epoch's order (all ranks together,
framework/data/sampler.py), so that a resume at any world size, batch size or accumulation
continues on the next sample; the check that a resume continues on the same data; and what a
resume does with the data, said when the world, batch or accumulation changed."""
from __future__ import annotations

from framework.data.loaders import batches_yielded
from framework.errors import CheckpointError


def data_position(loader, batches_taken: int, epoch: int, accumulate: int, fingerprint: str | None) -> dict:
    """{"epoch", "sample", "of"} plus what dealt it (ranks, batch, accumulation) and the data's
    fingerprint, after `batches_taken` batches of the epoch on this rank."""
    sampler = loader.sampler
    sample = (sampler.length if batches_taken >= len(loader)
              else sampler.consumed(min(batches_taken * loader.batch_size, len(sampler))))
    return {"epoch": epoch, "sample": sample, "of": sampler.length, "ranks": sampler.replicas,
            "batch_size": loader.batch_size, "accumulate": accumulate, "fingerprint": fingerprint}


def position_of_older_checkpoint(loop: dict, meta: dict, saved_world: int) -> dict:
    """The data position of a checkpoint written before positions were kept in samples: the
    loader's batches handed out, times its batch size and the data shares it was dealt in."""
    shares = int(meta.get("data_parallel_size", saved_world))
    batch = int(((meta.get("config") or {}).get("data") or {}).get("batch_size") or 1)
    return {"epoch": loop["state"].get("epoch", 0), "sample": batches_yielded(loop.get("train_loader") or {}) * batch
            * shares, "of": None, "ranks": shares, "batch_size": batch, "accumulate": None}


def changed_data(position: dict, now: str | None, length_now: int, allow_changed: bool, path) -> str | None:
    """A resume continues on the data it was trained on: another corpus (files added or changed,
    another tokenizer) is refused (CheckpointError) unless data.allow_changed=true, which gets a
    warning (returned); None when the data is the same or cannot be told."""
    saved = position.get("fingerprint")
    if saved is None or now is None or saved == now:
        return None
    length = position.get("of")
    sizes = (f" ({length:,} training samples then, {length_now:,} now)"
             if length is not None and length != length_now else "")
    if not allow_changed:
        raise CheckpointError(f"{path} was trained on other data than this run's (fingerprint {saved}, now {now}"
                              f"{sizes}): files were added or changed, or the tokenizer or a data setting "
                              "differs. Resume with the same data, or set data.allow_changed=true to continue on "
                              "this data (the position then counts samples of its order).")
    return (f"the data differs from the checkpoint's (fingerprint {saved}, now {now}{sizes}); continuing on it as "
            "data.allow_changed=true asks: the position counts samples of the new order")


def resume_note(position: dict, saved_world: int, loader, world_size: int, epoch: int, accumulate: int) -> str:
    """What a resume does with the data, said when the world, batch or accumulation changed (the
    same ones continue exactly as the run would have: nothing to say)."""
    sampler = loader.sampler
    before = (position.get("ranks"), position.get("batch_size"), position.get("accumulate"))
    now = (sampler.replicas, loader.batch_size, accumulate)
    if before == now and saved_world == world_size:
        return ""
    sample, length = int(position["sample"]), sampler.length
    rest = length - sample
    if getattr(loader.dataset, "streamed", False):  # an endless stream: no epoch to finish
        what = f"the stream continues at sample {sample:,} (no sample skipped or repeated)"
    elif rest <= 0:
        what = "the epoch it was in had ended: the next one starts"
    else:
        sampler.set_epoch(epoch, sample)  # (set again when the epoch starts)
        what = (f"the data continues at sample {sample} of {length} in epoch {epoch}'s order (no sample skipped or "
                f"repeated); the epoch's other {rest} samples make {'; '.join(_rest_of_epoch(loader, rest, accumulate))}")
    ranks, batch, accumulated = (v if v is not None else "?" for v in before)
    return (f"resuming a checkpoint of {saved_world} process(es) ({ranks} data share(s) x batch {batch} x "
            f"accumulate {accumulated}) with {world_size} ({now[0]} x {now[1]} x {now[2]}): weights, "
            f"optimizer, step and epoch are exact; {what}")


def _rest_of_epoch(loader, rest: int, accumulate: int) -> list[str]:
    """The rest of the epoch as this run deals it: its steps, and what is dropped or repeated."""
    share, batches, ranks, batch = len(loader.sampler), len(loader), loader.sampler.replicas, loader.batch_size
    steps = -(-batches // accumulate)
    parts = [f"{steps} step(s) of up to {ranks} x {batch} x {accumulate} samples"]
    if share - batches * batch > 0:
        parts.append(f"{share - batches * batch} sample(s) per rank left over and dropped (data.drop_last)")
    elif batches and share - (batches - 1) * batch < batch:
        parts.append(f"its last batch {share - (batches - 1) * batch} sample(s) per rank")
    if share * ranks > rest:
        parts.append(f"{share * ranks - rest} position(s) at the end repeat the epoch's first samples, as at "
                     "every epoch's end")
    return parts
