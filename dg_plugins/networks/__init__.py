"""Backbones (featurizers) and heads: each featurizer returns ``[N, n_outputs]`` features, the
staged ones also their stages. torchvision and timm load only when a 224x224 model is built."""

from dg_plugins.networks.staged import StagedFeaturizer  # the stage interface DMG masks
from dg_plugins.networks.featurizers import (Classifier, Featurizer, LeNet, MNIST_CNN,  # CNNs
                                             ResNet, backbone_for)
from dg_plugins.networks.vit import ViTFeaturizer, create_vit, replace_ffn  # timm ViTs
from dg_plugins.networks.moe import MoEFFN  # GMoE's sparse mixture-of-experts FFN
from dg_plugins.networks.pretrained import PretrainedWeightsUnavailable  # offline-safe weights
