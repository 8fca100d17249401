"""`framework convert`: export a checkpoint's weights (torch or safetensors, or a Hugging Face
from_pretrained directory), or import a DeepSpeed native checkpoint into the framework's format."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from framework.checkpoint.convert import export_weights, import_deepspeed, read_model_state
from framework.checkpoint.format import read_meta
from framework.checkpoint.load import find_checkpoint
from framework.cli.adapter_export import adapter_config, merged_state, write_merged_run, write_peft_directory
from framework.cli.hub_tokenizer import end_marker_ids, export_tokenizer, run_tokenizer, write_generation_ids
from framework.errors import ConfigError, ExitCode, UserError, report
from framework.generation.load import quantizing_precision
from framework.models.hf_causal_lm import is_hub_model, save_for_hub


def parser() -> argparse.ArgumentParser:
    convert = argparse.ArgumentParser(prog="framework convert",
                                      description="export a checkpoint's weights, or import a DeepSpeed checkpoint")
    convert.add_argument("checkpoint", help="a checkpoint directory, or a run directory (its best checkpoint; with "
                         "--from deepspeed: a DeepSpeed checkpoint directory)")
    convert.add_argument("out", help="the file (export), or the directory (--to hf, import) to write")
    convert.add_argument("--to", choices=["torch", "safetensors", "hf", "peft", "run"], default="torch",
                         help="export format: a state_dict file (torch, safetensors), hf: a directory that "
                              "transformers' from_pretrained loads (Hugging Face models), peft: an adapter run's "
                              "adapters as a directory peft.PeftModel.from_pretrained loads onto the base model, "
                              "run: a run directory of this framework holding the plain model (any model: a "
                              "teacher, a reference, a ckpt_path); an adapter run's torch, safetensors, hf and run "
                              "exports have the adapters merged in")
    convert.add_argument("--from", dest="source", choices=["framework", "deepspeed"], default="framework",
                         help="what CHECKPOINT is")
    convert.add_argument("--tag", default=None, help="with --from deepspeed: the tag (default: 'latest')")
    return convert


def export_hub_directory(checkpoint: Path, out: Path) -> Path:
    """A checkpoint of a Hugging Face model (model=hf_causal_lm) as a from_pretrained directory,
    with the run's tokenizer when it used a local one (its special ids, and the chat template a
    chat run trained with)."""
    meta, state = merged_state(checkpoint) if adapter_config(read_meta(checkpoint)) else read_model_state(checkpoint)
    model_node = (meta.get("config") or {}).get("model") or {}
    if not is_hub_model(model_node):
        raise ConfigError(f"--to hf: {checkpoint} holds a {model_node.get('_target_', 'model of unknown type')}, not "
                          "a Hugging Face model (model=hf_causal_lm); export its weights with --to safetensors.")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--to hf: {out} exists and is not empty; give a new directory.")
    save_for_hub(state, model_node, out)
    config = json.loads((out / "config.json").read_text())
    tokenizer, template = run_tokenizer(meta.get("config") or {})
    ids = export_tokenizer(tokenizer, out, config.get("n_positions") or config.get("max_position_embeddings"), template)
    write_generation_ids(out, ids, end_marker_ids(tokenizer, template))
    return out


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        if args.source == "deepspeed":
            out = import_deepspeed(Path(args.checkpoint), Path(args.out), tag=args.tag)
            print(f"wrote {out}")
            return ExitCode.OK
        checkpoint, _, why = find_checkpoint(Path(args.checkpoint).expanduser(), "framework convert")
        if why != "given":
            print(f"framework convert: {checkpoint} ({why})")
        quantized = quantizing_precision((read_meta(checkpoint).get("config") or {}))
        if quantized is not None and args.to != "peft":
            print(f"framework convert: the run trained over {quantized.name}-quantized layers; the export holds the "
                  "float weights they were quantized from (with the adapters merged in, for an adapter run): its "
                  "outputs differ from the run's by the quantization error.", flush=True)
        if args.to == "hf":
            out = export_hub_directory(checkpoint, Path(args.out))
        elif args.to == "peft":
            out = write_peft_directory(checkpoint, Path(args.out))
        elif args.to == "run":
            out = write_merged_run(checkpoint, Path(args.out))
        elif adapter_config(read_meta(checkpoint)):  # the adapters merged into the weights
            _, state = merged_state(checkpoint)
            out = export_weights(checkpoint, Path(args.out), to=args.to, state=state)
        else:
            out = export_weights(checkpoint, Path(args.out), to=args.to)
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    print(f"wrote {out}")
    return ExitCode.OK
