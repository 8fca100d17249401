import pytest
import torch

from framework.errors import ConfigError
from framework.models.gpt import GPT
from framework.models.mlp import MLP


def test_gpt_is_causal_and_shaped():
    torch.manual_seed(0)
    model = GPT(block_size=16, n_layer=1, n_embd=32, n_head=2).eval()
    x = torch.randint(0, 256, (2, 16))
    out = model(x)
    assert out.shape == (2, 16, 256)
    y = x.clone()
    y[:, 10:] = 0  # changing later tokens must not change earlier logits
    torch.testing.assert_close(model(y)[:, :10], out[:, :10])
    assert model.head.weight is model.tok_emb.weight


def test_gpt_rejects_bad_shapes():
    with pytest.raises(ConfigError, match="n_head=3 must divide"):
        GPT(n_embd=32, n_head=3)
    with pytest.raises(ValueError, match="exceeds model.block_size"):
        GPT(block_size=4, n_embd=8, n_head=2)(torch.zeros(1, 5, dtype=torch.long))


def test_mlp():
    assert MLP(in_features=64, num_classes=10)(torch.zeros(3, 64)).shape == (3, 10)
