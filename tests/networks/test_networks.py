"""Featurizer choice, random-init and local-checkpoint backbones, offline fail-fast."""

import time

import pytest
import torch

from dg_plugins import hparams as hparams_lib
from dg_plugins.networks import (MNIST_CNN, Classifier, Featurizer, PretrainedWeightsUnavailable,
                                 ResNet, ViT)


def hp(dataset="PACS", **overrides):
    h = hparams_lib.default_hparams("ERM", dataset)
    h.update(pretrained=False, resnet50_augmix=False, resnet18=True)
    h.update(overrides)
    return h


def test_featurizer_is_chosen_by_input_shape():
    assert isinstance(Featurizer((2, 28, 28), hp("Debug28")), MNIST_CNN)
    assert isinstance(Featurizer((3, 224, 224), hp()), ResNet)
    with pytest.raises(NotImplementedError, match=r"input shape \(3, 64, 64\).*supported"):
        Featurizer((3, 64, 64), hp())


def test_mnist_cnn_matches_domainbeds_layout_and_width_option():
    net = MNIST_CNN((1, 28, 28))
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.stride[0]) for c in convs] == [
        (1, 64, 1), (64, 128, 2), (128, 128, 1), (128, 128, 1)]
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 128)
    narrow = MNIST_CNN((1, 28, 28), width=32)
    assert narrow.n_outputs == 32 and narrow(torch.randn(2, 1, 28, 28)).shape == (2, 32)
    with pytest.raises(ValueError, match="multiple of 16"):
        MNIST_CNN((1, 28, 28), width=20)


def test_resnet_channel_adaptation_copies_filters_modulo_3():
    net = ResNet((5, 224, 224), hp())
    w = net.network.conv1.weight
    assert w.shape[1] == 5 and torch.equal(w[:, 3], w[:, 0]) and torch.equal(w[:, 4], w[:, 1])
    assert net(torch.randn(2, 5, 224, 224)).shape == (2, 512)


def test_freeze_bn_survives_train():
    net = ResNet((3, 224, 224), hp(freeze_bn=True)).train()
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)


def test_local_checkpoint_is_loaded(tmp_path):
    source = ResNet((3, 224, 224), hp())
    path = tmp_path / "weights.pth"
    torch.save({"state_dict": {"module." + k: v for k, v in source.network.state_dict().items()}},
               path)
    loaded = ResNet((3, 224, 224), hp(pretrained=True, pretrained_path=str(path)))
    assert torch.equal(loaded.network.conv1.weight, source.network.conv1.weight)
    with pytest.raises(FileNotFoundError, match="pretrained_path"):
        ResNet((3, 224, 224), hp(pretrained=True, pretrained_path=str(tmp_path / "none.pth")))


@pytest.mark.parametrize("overrides, what", [
    ({"resnet50_augmix": True}, "timm resnet50.ram_in1k"),
    ({"resnet50_augmix": False, "resnet18": False}, "torchvision resnet50"),
])
def test_offline_pretrained_weights_fail_fast_with_the_fixes(overrides, what):
    start = time.time()
    with pytest.raises(PretrainedWeightsUnavailable) as err:
        ResNet((3, 224, 224), hp(pretrained=True, **overrides))
    assert time.time() - start < 30  # no hub retry loop
    message = str(err.value)
    assert what in message and "pretrained_path" in message and '"pretrained": false' in message
    assert "HF_HUB_OFFLINE" in message


def test_timm_vit_featurizer():
    net = Featurizer((3, 224, 224), hp(vit=True, vit_arch="vit_tiny_patch16_224"))
    assert isinstance(net, ViT) and net.n_outputs == 192
    assert net(torch.randn(2, 3, 224, 224)).shape == (2, 192)


def test_classifier_heads():
    assert isinstance(Classifier(128, 7), torch.nn.Linear)
    deep = Classifier(128, 7, is_nonlinear=True)
    assert [m.out_features for m in deep if isinstance(m, torch.nn.Linear)] == [64, 32, 7]
