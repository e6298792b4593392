"""Backbones (featurizers) and heads. torchvision and timm load only when a 224x224 model is built.

Every featurizer has ``n_outputs`` and returns ``[N, n_outputs]`` features; the staged ones
(:class:`StagedFeaturizer`: MNIST CNN, LeNet, ResNet, ViT) also expose their stages.
"""

from dg_plugins.networks.featurizers import (LeNet, MNIST_CNN, Classifier, Featurizer, ResNet,
                                             backbone_for)
from dg_plugins.networks.pretrained import PretrainedWeightsUnavailable
from dg_plugins.networks.staged import StagedFeaturizer
from dg_plugins.networks.vit import ViTFeaturizer

__all__ = ["Classifier", "Featurizer", "LeNet", "MNIST_CNN", "PretrainedWeightsUnavailable",
           "ResNet", "StagedFeaturizer", "ViTFeaturizer", "backbone_for"]
