"""ERM's mechanism (the model for a method's own tests): what one ``update`` computes, checked
against an independent computation, not only shapes."""

import copy

import torch
import torch.nn.functional as F

import dg_plugins.datasets  # noqa: F401  (registers Debug28)
from support.helpers import tiny_hparams
from dg_plugins.algorithms import ERM, split_minibatches
from dg_plugins.registry import DATASETS


def make(dataset_name="Debug28", num_domains=2, **overrides):
    torch.manual_seed(0)
    dataset = DATASETS.get(dataset_name)("", [], {})
    hp = tiny_hparams("ERM", dataset_name, **{"mnist_cnn_width": 32, **overrides})
    return ERM(dataset.input_shape, dataset.num_classes, num_domains, hp), dataset, hp


def batches_of(dataset, sizes):
    return [(dataset[i].tensors[0][:n], dataset[i].tensors[1][:n]) for i, n in enumerate(sizes)]


def test_split_minibatches_labels_each_sample_with_its_minibatch_index():
    a = (torch.zeros(3, 2), torch.tensor([0, 1, 0]))
    b = (torch.ones(2, 2), torch.tensor([1, 1]))
    x, y, domain = split_minibatches([a, b])
    assert x.shape == (5, 2) and y.tolist() == [0, 1, 0, 1, 1]
    assert domain.tolist() == [0, 0, 0, 1, 1] and domain.dtype == torch.long


def test_update_is_one_adam_step_on_the_pooled_cross_entropy():
    """The loss is the mean CE over all pooled samples (an env with more samples weighs more),
    and the parameters move exactly as one Adam step on that loss moves them."""
    algorithm, dataset, hp = make(weight_decay=0.0)
    batches = batches_of(dataset, [6, 2])
    reference = copy.deepcopy(algorithm.network)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    expected_loss = F.cross_entropy(reference(x), y)
    opt = torch.optim.Adam(reference.parameters(), lr=hp["lr"])
    opt.zero_grad()
    expected_loss.backward()
    opt.step()

    out = algorithm.update(batches)
    assert abs(out["loss"] - expected_loss.item()) < 1e-6
    for (name, p), q in zip(algorithm.network.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, msg=name)


def test_how_samples_are_split_among_domains_does_not_matter():
    """ERM pools the minibatches: moving samples between them gives the same step."""
    first, dataset, _ = make()
    second = copy.deepcopy(first)
    x, y = dataset[0].tensors[0][:8], dataset[0].tensors[1][:8]
    first.update([(x[:4], y[:4]), (x[4:], y[4:])])
    second.update([(x[:1], y[:1]), (x[1:], y[1:])])
    for p, q in zip(first.parameters(), second.parameters()):
        torch.testing.assert_close(p, q)


def test_predict_is_the_classifier_on_the_features():
    algorithm, dataset, _ = make()
    x = dataset[0].tensors[0][:4]
    algorithm.eval()
    with torch.no_grad():
        torch.testing.assert_close(algorithm.predict(x),
                                   algorithm.classifier(algorithm.featurizer(x)))
        torch.testing.assert_close(algorithm.predict(x), algorithm.network(x))


def test_training_lowers_the_loss_on_a_fixed_batch():
    algorithm, dataset, _ = make(lr=1e-2)
    batches = batches_of(dataset, [8, 8])
    losses = [algorithm.update(batches)["loss"] for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
