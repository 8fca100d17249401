"""The framework's own lm-eval model (framework/generation/harness.py) against a hand computation on
the same tiny GPT: each request's log-likelihood is its continuation's tokens alone, scored after
its own context, returned in the order asked, whatever the lengths batched together; `is_greedy` only
when every continuation token is the argmax; a multiple-choice answer is the argmax of those sums;
a generation is the greedy decode cut at the first stop string of the request's `until`."""
from __future__ import annotations

import pytest
import torch

from framework.data.tokenizer import loaded_tokenizer
from framework.generation.decode import generate
from framework.generation.load import Loaded
from framework.models.gpt import GPT
from framework.sampling import Sampling

pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def loaded():
    torch.manual_seed(0)
    model = GPT(vocab_size=256, block_size=64, n_layer=2, n_embd=32, n_head=2, dropout=0.0).eval()
    return Loaded(model, loaded_tokenizer("bytes"), "a tiny GPT")


def _by_hand(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    whole = torch.tensor([context + continuation])
    with torch.no_grad():
        logits = model(whole[:, :-1]).float().log_softmax(-1)[0]
    scores = logits[len(context) - 1:]
    wanted = torch.tensor(continuation)
    return float(scores.gather(-1, wanted[:, None]).sum()), bool((scores.argmax(-1) == wanted).all())


def _greedy(model, context: list[int], n: int) -> list[int]:
    return generate(model, context, Sampling(max_new_tokens=n, temperature=0.0)).ids


def test_log_likelihoods_are_each_continuations_alone_in_request_order(loaded):
    from framework.generation.harness import harness_model

    lm = harness_model(loaded, batch_size=2)
    texts = [("def main(", "):"), ("import o", "s"), ("for i in range(1", "0):\n    pass"), ("x", " = 1"),
             ("class Foo(object):\n    def __init", "__(self)")]
    requests = [((c, t), list(c.encode()), list(t.encode())) for c, t in texts]  # contexts of 1 to 25 tokens
    got = lm._loglikelihood_tokens(requests)
    for (_, context, continuation), (score, greedy) in zip(requests, got):
        want_score, want_greedy = _by_hand(loaded.model, context, continuation)
        assert score == pytest.approx(want_score, abs=1e-4) and greedy == want_greedy
    assert len({round(score, 3) for score, _ in got}) == len(got)  # distinct: an order mix-up would show


def test_is_greedy_needs_every_token_to_be_the_argmax(loaded):
    from framework.generation.harness import harness_model

    lm = harness_model(loaded, batch_size=4)
    context = list(b"def f(x):\n    return ")
    own = _greedy(loaded.model, context, 3)
    wrong_last = own[:2] + [(own[2] + 1) % 256]
    (_, all_greedy), (_, one_off) = lm._loglikelihood_tokens([(None, context, own), (None, context, wrong_last)])
    assert all_greedy is True and one_off is False


def test_a_multiple_choice_answer_is_the_argmax_of_the_sums(loaded):
    from lm_eval.api.instance import Instance

    from framework.generation.harness import harness_model

    lm = harness_model(loaded, batch_size=3)
    context, choices = "value =", [" None", " True", " 42", " 'text'"]
    requests = [Instance("loglikelihood", {}, (context, choice), i) for i, choice in enumerate(choices)]
    scores = [score for score, _ in lm.loglikelihood(requests)]
    by_hand = [_by_hand(loaded.model, list(context.encode()), list(choice.encode()))[0] for choice in choices]
    assert max(range(4), key=scores.__getitem__) == max(range(4), key=by_hand.__getitem__)
    assert scores == pytest.approx(by_hand, abs=1e-4)


def test_a_generation_is_the_greedy_decode_cut_at_the_first_stop_string(loaded):
    from lm_eval.api.instance import Instance

    from framework.generation.harness import harness_model

    lm = harness_model(loaded)
    context = "def main():\n"
    decoded = loaded.tokenizer.decode(_greedy(loaded.model, list(context.encode()), 16))
    stop = decoded[4]  # a character the greedy text holds: it is cut before its first appearance
    request = Instance("generate_until", {}, (context, {"until": [stop], "max_gen_toks": 16}), 0)
    assert lm.generate_until([request]) == [decoded.split(stop)[0]]
    assert len(decoded.split(stop)[0]) < len(decoded)
    unstopped = Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 16}), 0)
    assert lm.generate_until([unstopped]) == [decoded]
