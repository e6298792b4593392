"""Backbones (featurizers) and heads. torchvision and timm load only when a 224x224 model is built.
"""

from dg_plugins.networks.featurizers import (LeNet, MNIST_CNN, Classifier, Featurizer, ResNet,
                                             StagedFeaturizer, ViT, backbone_for)
from dg_plugins.networks.pretrained import PretrainedWeightsUnavailable

__all__ = ["Classifier", "Featurizer", "LeNet", "MNIST_CNN", "PretrainedWeightsUnavailable",
           "ResNet", "StagedFeaturizer", "ViT", "backbone_for"]
