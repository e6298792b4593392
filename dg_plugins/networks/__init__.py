"""Backbones (featurizers) and heads. torchvision and timm load only when a 224x224 model is built.
"""

from dg_plugins.networks.featurizers import MNIST_CNN, Classifier, Featurizer, ResNet, ViT
from dg_plugins.networks.pretrained import PretrainedWeightsUnavailable

__all__ = ["Classifier", "Featurizer", "MNIST_CNN", "PretrainedWeightsUnavailable", "ResNet", "ViT"]
