"""Sharded from birth: fsdp and ZeRO-3 build the model without any rank holding all of it, and
start from the very weights an ordinary build makes with the same seed (bit for bit)."""
from __future__ import annotations

import pytest
import torch

from framework.construction.activation_checkpointing import checkpoint_units
from framework.construction.meta_init import build_on_meta, replay
from framework.construction.units import choose_units
from framework.models.gpt import GPT
from framework.models.mlp import MLP
from framework.strategy.fsdp import FSDPStrategy
from framework.strategy.hsdp import HSDPStrategy
from framework.strategy.model_parallel import ModelParallelStrategy
from tests.conftest import TINY_GPT, assert_state_equal, checkpoints, load_model_state, run_inprocess


@pytest.mark.parametrize("factory", [lambda: GPT(n_layer=2, n_embd=64, n_head=4), lambda: MLP()],
                         ids=["gpt", "mlp"])
def test_replayed_initialisation_is_the_ordinary_build(factory):
    torch.manual_seed(7)
    reference = factory()
    after_reference = torch.rand(4)
    torch.manual_seed(7)
    model, log = build_on_meta(factory)
    assert log.problem is None and next(model.parameters()).is_meta
    written = {}
    replay(log, written.__setitem__)
    assert torch.equal(torch.rand(4), after_reference)  # the RNG ends where an ordinary build leaves it
    assert set(written) == {n for n, _ in reference.named_parameters()}
    for name, param in reference.named_parameters():
        assert torch.equal(written[name], param), name


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_rotary_families_are_built_on_meta_too(family):
    """Llama and Qwen2 compute their rotary buffers in a constructor: that parameterless module is
    built again on the CPU after the shards are made; everything else is replayed as for the GPT."""
    pytest.importorskip("transformers")
    from framework.models.hf_causal_lm import causal_lm

    def factory():
        return causal_lm(config={"model_type": family, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 64,
                                 "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2})

    torch.manual_seed(3)
    reference = factory()
    after_reference = torch.rand(4)
    torch.manual_seed(3)
    model, log = build_on_meta(factory)
    assert log.problem is None and list(log.rebuilt) == ["model.rotary_emb"]
    written = {}
    replay(log, written.__setitem__)
    assert torch.equal(torch.rand(4), after_reference)
    for name, tensor in [*reference.named_parameters(), *reference.named_buffers()]:
        assert torch.equal(written[name], tensor), name
    for strategy in (FSDPStrategy(), HSDPStrategy(), ModelParallelStrategy()):  # no rank builds it whole first
        built = strategy.build_model(factory)
        assert all(t.is_meta for t in [*built.parameters(), *built.buffers()]) and strategy.model_layout().init_log is not None


def test_what_cannot_be_replayed_is_named():
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 3))

    _, log = build_on_meta(Noisy)
    assert "torch.randn" in log.problem


def test_units_follow_the_one_rule():
    gpt = GPT(n_layer=3, n_embd=32, n_head=2)
    units = choose_units(gpt)
    assert [type(m).__name__ for m in units.modules] == ["Block"] * 3 and "sharding_units" in units.rule
    block = sum(p.numel() for p in gpt.blocks[0].parameters())
    assert units.gathered[:3] == [block] * 3
    assert units.gathered[-1] == sum(p.numel() for p in gpt.parameters()) - 3 * block  # the root's share
    mlp = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 10))
    by_size = choose_units(mlp, min_unit_params=500_000)  # a model with no units of its own: the size rule
    assert by_size.modules == [mlp[0]] and "size rule" in by_size.rule and by_size.largest == 1_001_000

    class HF(torch.nn.Module):  # a Hugging Face model names its units in _no_split_modules
        _no_split_modules = ["Linear"]

        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    assert len(choose_units(HF()).modules) == 2 and "_no_split_modules" in choose_units(HF()).rule
    with pytest.raises(Exception, match="no module of class Blok. Did you mean Block"):
        choose_units(gpt, ["Blok"])


def test_activation_checkpointing_saves_activations_not_gradients():
    """Each unit keeps only its input; the gradients are the same as without checkpointing."""
    def loss_and_saved(checkpointed: bool):
        torch.manual_seed(0)
        model = GPT(n_layer=3, n_embd=32, n_head=2)
        if checkpointed:
            assert checkpoint_units(choose_units(model)) == 3
        saved = []
        x = torch.randint(0, 256, (2, 16))
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss = model(x).float().square().mean()
        loss.backward()
        return loss, {n: p.grad for n, p in model.named_parameters()}, sum(saved)

    loss, grads, saved = loss_and_saved(False)
    loss_ac, grads_ac, saved_ac = loss_and_saved(True)
    assert torch.equal(loss, loss_ac) and saved_ac < saved / 2
    for name in grads:
        torch.testing.assert_close(grads_ac[name], grads[name], rtol=0, atol=1e-7)


def test_a_unit_the_model_lacks_is_refused_before_launch():
    """The run, `framework plan` and `framework validate` share prepare(): the unit rule runs on
    the meta model there, so a wrap_modules typo never reaches a worker."""
    from framework.errors import ConfigError
    from framework.preflight import prepare
    from tests.conftest import compose_cfg

    with pytest.raises(ConfigError, match=r"strategy.wrap_modules=\['Blok'\]: the model has no module of class Blok"):
        prepare(compose_cfg(["strategy=fsdp", "devices=2", "strategy.wrap_modules=[Blok]"]))


FROZEN = [*TINY_GPT, "trainer.max_steps=1", "trainer.val_at_start=false", "trainer.val_batches=1",
          "optimizer.lr=0.0", "optimizer.weight_decay=0.0", "callbacks=[checkpoint]", "model.dropout=0.0"]


@pytest.mark.slow
def test_sharded_builds_start_from_the_single_device_weights(tmp_path):
    """With lr=0 the first checkpoint holds the initial weights: fsdp at 1 and 2 ranks and ZeRO-3
    at 2 ranks (each rank materialising only its shards) equal single_device's, bit for bit."""
    runs = {"single": ["strategy=single_device"], "fsdp1": ["strategy=fsdp", "devices=1"],
            "fsdp2": ["strategy=fsdp", "devices=2"], "zero3": ["strategy=deepspeed_stage_3", "devices=2"]}
    states = {}
    for name, extra in runs.items():
        run_inprocess([*FROZEN, *extra], tmp_path / name)
        states[name] = load_model_state(checkpoints(tmp_path / name)[-1])
    for name in ("fsdp1", "fsdp2", "zero3"):
        assert_state_equal(states["single"], states[name], name)


def test_safetensors_weights_are_mapped_not_read(tmp_path):
    from safetensors.torch import save_file

    from framework.checkpoint.weights import read_weights
    from framework.errors import CheckpointError

    state = {"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    save_file(state, str(tmp_path / "w.safetensors"), metadata={"tied": '{"c": "a"}'})
    loaded = read_weights(tmp_path / "w.safetensors")
    assert torch.equal(loaded["a"], state["a"]) and torch.equal(loaded["b"], state["b"]) and loaded["c"] is loaded["a"]
    data = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-8])
    with pytest.raises(CheckpointError, match="truncated"):
        read_weights(tmp_path / "cut.safetensors")


@pytest.mark.slow
def test_plain_weights_start_a_sharded_run(tmp_path):
    """`ckpt_path=weights.safetensors` (or a torch state_dict file) starts fsdp at 2 ranks from
    exactly those weights (lr=0: the first checkpoint holds them)."""
    from framework.checkpoint.convert import export_weights

    run_inprocess([*FROZEN, "strategy=single_device", "optimizer.lr=1e-2", "seed=5"], tmp_path / "source")
    trained = checkpoints(tmp_path / "source")[-1]
    export_weights(trained, tmp_path / "w.safetensors", to="safetensors")
    export_weights(trained, tmp_path / "w.pt", to="torch")
    expected = load_model_state(trained)
    for name in ("w.safetensors", "w.pt"):
        run_inprocess([*FROZEN, "strategy=fsdp", "devices=2", f"ckpt_path={tmp_path / name}"], tmp_path / name[2:])
        assert_state_equal(expected, load_model_state(checkpoints(tmp_path / name[2:])[-1]), name)
