"""task.metrics: torchmetrics metrics from YAML, added exactly across batches and ranks (their
states are sums), equal to scikit-learn's on the same predictions; what cannot be exact is refused."""
from __future__ import annotations

import pytest
import torch
from sklearn.metrics import f1_score, recall_score

from framework.errors import ConfigError
from framework.tasks.classification import Classification
from framework.tasks.language_modeling import LanguageModeling
from framework.tasks.metrics import Metrics, default_name

pytest.importorskip("torchmetrics")


class Fixed(torch.nn.Module):
    """Returns the logits it is given as input (a model whose predictions the test chooses)."""

    def forward(self, x):
        return x


def add(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] for k in a}


def test_f1_and_per_class_recall_from_summed_states_equal_sklearn_on_all_the_samples():
    torch.manual_seed(0)
    logits, labels = torch.randn(300, 5), torch.randint(0, 5, (300,))
    task = Classification(metrics=["MulticlassF1Score", {"metric": "MulticlassRecall", "average": "none",
                                                          "name": "recall"}])
    # three batches as two "ranks" would score them: sums of sums, in any grouping
    parts = [task.validation_step(Fixed(), (logits[a:b], labels[a:b])) for a, b in ((0, 128), (128, 256), (256, 300))]
    totals = add(add(parts[0], parts[2]), parts[1])
    metrics = task.compute_metrics(totals)
    predicted = logits.argmax(-1).numpy()
    assert metrics["f1_score"] == pytest.approx(f1_score(labels.numpy(), predicted, average="macro"), abs=1e-6)
    per_class = recall_score(labels.numpy(), predicted, average=None)
    assert [metrics[f"recall/{i}"] for i in range(5)] == pytest.approx(list(per_class), abs=1e-6)
    assert metrics["accuracy"] == pytest.approx((predicted == labels.numpy()).mean())


def test_a_language_models_metric_counts_only_scored_tokens():
    task = LanguageModeling(metrics=[{"metric": "MulticlassAccuracy", "top_k": 2, "average": "micro", "name": "top2"}])
    vocab = 7
    logits = torch.full((1, 4, vocab), -10.0)
    tokens = torch.tensor([[1, 2, 3, 4]])
    logits[0, 0, 2], logits[0, 0, 5] = 5.0, 4.0  # position 0 -> 2: first choice
    logits[0, 1, 0], logits[0, 1, 3] = 5.0, 4.0  # position 1 -> 3: second choice
    logits[0, 2, 0], logits[0, 2, 1] = 5.0, 4.0  # position 2 -> 4: missed

    class Returns(torch.nn.Module):
        def forward(self, input_ids, **_):
            return logits

    sums = task.validation_step(Returns(), {"input_ids": tokens, "labels": tokens})
    assert task.compute_metrics(sums)["top2"] == pytest.approx(2 / 3)
    masked = tokens.clone()
    masked[0, 3] = -100  # position 2's target is not scored
    sums = task.validation_step(Returns(), {"input_ids": tokens, "labels": masked})
    assert task.compute_metrics(sums)["top2"] == pytest.approx(1.0)


@pytest.mark.parametrize("spec,message", [
    (["MulticlassF1Scor"], "task.metrics[0]='MulticlassF1Scor': torchmetrics has no such metric. Did you mean "
                           "MulticlassF1Score?"),
    ([{"metric": "MulticlassAUROC"}], "its state preds, target keeps every prediction"),
    ([{"metric": "MulticlassF1Score", "averag": "macro"}], "task.metrics[0] (MulticlassF1Score): Unexpected keyword"),
    (["MulticlassF1Score", "MulticlassF1Score"], "a second metric named 'f1_score'"),
    ([3], "task.metrics[0]=3: give a torchmetrics class name"),
])
def test_metrics_that_cannot_be_computed_exactly_are_refused(spec, message):
    with pytest.raises(ConfigError) as err:
        Metrics(spec)
    assert message in str(err.value)


def test_names_drop_the_task_prefix():
    assert [default_name(n) for n in ("MulticlassF1Score", "BinaryAUROC", "MeanSquaredError", "MulticlassAccuracy")] \
        == ["f1_score", "auroc", "mean_squared_error", "accuracy"]
