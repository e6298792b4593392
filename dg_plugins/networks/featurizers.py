"""Featurizers (backbones) and heads, chosen from the input shape and hparams as DomainBed's
``networks.Featurizer`` does, plus a ``backbone`` hparam; each a :class:`StagedFeaturizer`.
Choices and differences from DomainBed: ``docs/networks.md``."""

from __future__ import annotations

import torch
import torch.nn as nn

from dg_plugins.catalog import IMAGE_SIZE_HPARAM
from dg_plugins.networks import pretrained as weights
from dg_plugins.networks.staged import StagedFeaturizer
from dg_plugins.networks.vit import ViTFeaturizer


class MNIST_CNN(StagedFeaturizer):
    """DomainBed's 28x28 CNN (``MNIST_CNN``), its width scaled by ``mnist_cnn_width``."""

    stage_names = ("block1", "block2", "block3", "block4")

    def __init__(self, input_shape, width: int = 128):
        super().__init__()
        if width % 16:
            raise ValueError(f"mnist_cnn_width must be a multiple of 16 (GroupNorm(8) on width/2 "
                             f"channels), got {width}")
        half = width // 2
        widths = [(input_shape[0], half, 1), (half, width, 2), (width, width, 1), (width, width, 1)]
        self.n_outputs = width
        self.blocks = nn.ModuleDict({
            name: nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1), nn.ReLU(),
                                nn.GroupNorm(8, c_out))
            for name, (c_in, c_out, stride) in zip(self.stage_names, widths)
        })
        self.stage_widths = {name: c_in for name, (c_in, _, _) in zip(self.stage_names, widths)}
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))

    def stage(self, name):
        return self.blocks[name]

    def pool(self, h):
        return self.avgpool(h).flatten(1)


class LeNet(StagedFeaturizer):
    """The LeNet-style ConvNet of single-source digits DG (32x32); too large a one is refused."""

    stage_names = ("conv1", "conv2", "fc1", "fc2")
    #: The largest LeNet built (800 MB with Adam's state; near 88x88 inputs).
    MAX_PARAMETERS = 50_000_000

    @staticmethod
    def num_parameters(input_shape, width: int = 1024) -> int:
        """The parameter count of ``LeNet(input_shape, width)``, without building it."""
        channels, height, width_px = input_shape
        flat_h, flat_w = ((height - 4) // 2 - 4) // 2, ((width_px - 4) // 2 - 4) // 2
        return ((channels * 25 + 1) * 64 + (64 * 25 + 1) * 128
                + (128 * flat_h * flat_w + 1) * width + (width + 1) * width)

    def __init__(self, input_shape, width: int = 1024):
        super().__init__()
        channels, height, width_px = input_shape
        if min(height, width_px) < 16:
            raise ValueError(f"LeNet needs inputs of at least 16x16 pixels, got {input_shape}")
        flat_h, flat_w = ((height - 4) // 2 - 4) // 2, ((width_px - 4) // 2 - 4) // 2
        count = self.num_parameters(input_shape, width)
        if count > self.MAX_PARAMETERS:
            raise ValueError(
                f"backbone 'lenet' on {tuple(input_shape)} inputs would have {count:,} parameters "
                f"(its fc1 takes the whole {flat_h}x{flat_w}x128 conv map; LeNet is made for "
                f"32x32 digits, where it has {self.num_parameters((channels, 32, 32), width):,}). "
                "Use --hparams '{\"backbone\": \"resnet\"}' (or \"vit\", or \"mnist_cnn\", which "
                "pools globally and takes any size), or give the dataset 32x32 images")
        self.layers = nn.ModuleDict({
            "conv1": nn.Sequential(nn.Conv2d(channels, 64, 5), nn.ReLU(), nn.MaxPool2d(2)),
            "conv2": nn.Sequential(nn.Conv2d(64, 128, 5), nn.ReLU(), nn.MaxPool2d(2)),
            "fc1": nn.Sequential(nn.Flatten(), nn.Linear(128 * flat_h * flat_w, width), nn.ReLU()),
            "fc2": nn.Sequential(nn.Linear(width, width), nn.ReLU()),
        })
        self.stage_widths = {"conv1": channels, "conv2": 64, "fc1": 128, "fc2": width}
        self.n_outputs = width

    def stage(self, name):
        return self.layers[name]

    def pool(self, h):
        return h


#: torchvision's ResNets: constructor, weights enum, features, and the URL of DomainBed's
#: ``IMAGENET1K_V1`` weights, checked before torchvision is imported (a probe stops there).
_TORCHVISION_RESNETS = {
    "resnet18": ("resnet18", "ResNet18_Weights", 512,
                 "https://download.pytorch.org/models/resnet18-f37072fd.pth"),
    "resnet50": ("resnet50", "ResNet50_Weights", 2048,
                 "https://download.pytorch.org/models/resnet50-0676ba61.pth"),
}
TIMM_AUGMIX_RESNET = "resnet50.ram_in1k"


class ResNet(StagedFeaturizer):
    """ResNet-18/50 featurizer (DomainBed's ``ResNet``); unlike DomainBed, ``resnet18`` true
    always builds a ResNet-18 (``docs/networks.md``)."""

    stage_names = ("layer1", "layer2", "layer3", "layer4")

    def __init__(self, input_shape, hparams):
        super().__init__()
        use_pretrained = hparams.get("pretrained", True)
        local_path = hparams.get("pretrained_path")
        download = use_pretrained and not local_path
        self.arch = resnet_arch(hparams)
        if self.arch == TIMM_AUGMIX_RESNET:
            self.network = weights.timm_model(TIMM_AUGMIX_RESNET, download)
            self.n_outputs = 2048
        else:
            name, weights_enum, self.n_outputs, url = _TORCHVISION_RESNETS[self.arch]
            if download:
                weights.check_url_available(url, f"torchvision {name}")
            from dg_plugins import compat  # noqa: F401  (before torchvision)
            import torchvision

            chosen = getattr(torchvision.models, weights_enum).IMAGENET1K_V1 if download else None
            if download and chosen.url != url:  # another torchvision's file than DomainBed's
                weights.check_url_available(chosen.url, f"torchvision {name}")
            self.network = getattr(torchvision.models, name)(weights=chosen)
        if use_pretrained and local_path:
            weights.load_local_weights(self.network, local_path)
        if input_shape[0] != 3:  # input channel i copies the RGB filter of channel i % 3
            conv = self.network.conv1
            self.network.conv1 = nn.Conv2d(input_shape[0], conv.out_channels, kernel_size=7,
                                           stride=2, padding=3, bias=False)
            with torch.no_grad():
                self.network.conv1.weight.copy_(conv.weight[:, torch.arange(input_shape[0]) % 3])
        self.network.fc = nn.Identity()
        self.stage_widths = {name: next(m for m in getattr(self.network, name).modules()
                                        if isinstance(m, nn.Conv2d)).in_channels
                             for name in self.stage_names}
        self.freeze_bn = hparams["freeze_bn"]
        self.dropout = nn.Dropout(hparams["resnet_dropout"])
        self.train()  # BatchNorm statistics frozen with freeze_bn

    def stem(self, x):
        net = self.network
        act = net.act1 if hasattr(net, "act1") else net.relu  # timm / torchvision names
        return net.maxpool(act(net.bn1(net.conv1(x))))

    def stage(self, name):
        return getattr(self.network, name)

    def pool(self, h):
        net = self.network
        pooled = net.global_pool(h) if hasattr(net, "global_pool") else net.avgpool(h).flatten(1)
        return self.dropout(pooled)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.freeze_bn:
            for m in self.network.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()
        return self


def resnet_arch(hparams) -> str:
    """"resnet18", :data:`TIMM_AUGMIX_RESNET` or "resnet50" (torchvision), from the hparams."""
    if hparams["resnet18"]:
        return "resnet18"
    return TIMM_AUGMIX_RESNET if hparams["resnet50_augmix"] else "resnet50"


#: What ``backbone: "auto"`` builds, by input size (DomainBed's rule plus LeNet for 32x32).
AUTO_BACKBONES = {(28, 28): "mnist_cnn", (32, 32): "lenet", (224, 224): "resnet"}


def backbone_for(input_shape, hparams) -> str:
    """``hparams["backbone"]``, or :data:`AUTO_BACKBONES`' choice when "auto"."""
    choice = hparams.get("backbone", "auto")
    shape = tuple(input_shape)
    if choice != "auto":
        return choice
    size = shape[1:3] if len(shape) == 3 else None
    if IMAGE_SIZE_HPARAM in hparams:  # an image folder's images: the 224x224 choice at any size
        size = (224, 224)
    choice = AUTO_BACKBONES.get(size)
    if choice is not None:
        return "vit" if choice == "resnet" and hparams.get("vit") else choice
    raise ValueError(
        f"no automatic backbone for input shape {shape} (automatic: (C, 28, 28) -> mnist_cnn, "
        "(C, 32, 32) -> lenet, (C, 224, 224) -> resnet, or vit with hparam 'vit'). Choose one "
        "with the hparam 'backbone': 'resnet' (any size >= 32), 'mnist_cnn' (any size), "
        "'lenet' (any size >= 16) or 'vit' (sizes divisible by the ViT's patch)")


def Featurizer(input_shape, hparams) -> nn.Module:
    """The featurizer for ``input_shape`` and ``hparams`` (see :func:`backbone_for`)."""
    input_shape = tuple(input_shape)
    if len(input_shape) != 3:
        raise ValueError(f"featurizers take (channels, height, width) inputs, got {input_shape}")
    choice = backbone_for(input_shape, hparams)
    builders = {"mnist_cnn": lambda: MNIST_CNN(input_shape, hparams.get("mnist_cnn_width", 128)),
                "lenet": lambda: LeNet(input_shape), "resnet": lambda: ResNet(input_shape, hparams),
                "vit": lambda: ViTFeaturizer(input_shape, hparams)}
    if choice in builders:
        return builders[choice]()
    from dg_plugins.hparams import BACKBONES

    raise ValueError(f"unknown backbone {choice!r}; choices: {', '.join(BACKBONES)}")


def Classifier(in_features: int, out_features: int, is_nonlinear: bool = False) -> nn.Module:
    """Linear head, or DomainBed's 3-layer MLP head (in -> in/2 -> in/4 -> out) when nonlinear."""
    if not is_nonlinear:
        return nn.Linear(in_features, out_features)
    return nn.Sequential(
        nn.Linear(in_features, in_features // 2), nn.ReLU(),
        nn.Linear(in_features // 2, in_features // 4), nn.ReLU(),
        nn.Linear(in_features // 4, out_features),
    )
