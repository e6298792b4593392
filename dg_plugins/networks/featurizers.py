"""Featurizers chosen from the input shape and hparams as DomainBed does (protocol spec 3)."""

from __future__ import annotations

import torch
import torch.nn as nn

from dg_plugins.networks import pretrained as weights


class MNIST_CNN(nn.Module):
    """DomainBed's 28x28 CNN (spec 3.2): four 3x3 convs (64, 128 s2, 128, 128), each followed by
    ReLU and GroupNorm(8); global average pooling to a 128-d feature. ``width`` (hparam
    ``mnist_cnn_width``, DomainBed's 128 by default) scales it: convs (width/2, width, width,
    width) and a ``width``-d feature; the CPU benchmark RotatedMNIST5k uses 32 (16x fewer FLOPs)."""

    def __init__(self, input_shape, width: int = 128):
        super().__init__()
        if width % 16:
            raise ValueError(f"mnist_cnn_width must be a multiple of 16 (GroupNorm(8) on width/2 "
                             f"channels), got {width}")
        half = width // 2
        widths = [(input_shape[0], half, 1), (half, width, 2), (width, width, 1), (width, width, 1)]
        self.n_outputs = width
        layers = []
        for c_in, c_out, stride in widths:
            layers += [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1), nn.ReLU(),
                       nn.GroupNorm(8, c_out)]
        self.body = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.activation = nn.Identity()

    def forward(self, x):
        return self.activation(self.avgpool(self.body(x)).flatten(1))


_TORCHVISION_RESNETS = {
    "resnet18": ("resnet18", "ResNet18_Weights", 512),
    "resnet50": ("resnet50", "ResNet50_Weights", 2048),
}
TIMM_AUGMIX_RESNET = "resnet50.ram_in1k"


def _adapt_input_channels(conv: nn.Conv2d, channels: int) -> nn.Conv2d:
    """A bias-free 7x7/2 conv for ``channels`` inputs; input channel i copies the pretrained filter
    of channel ``i % 3`` (spec 3.3)."""
    new = nn.Conv2d(channels, conv.out_channels, kernel_size=7, stride=2, padding=3, bias=False)
    with torch.no_grad():
        for i in range(channels):
            new.weight[:, i] = conv.weight[:, i % 3]
    return new


class ResNet(nn.Module):
    """ResNet-18/50 featurizer (spec 3.3). ``resnet18`` picks torchvision's ResNet-18 (else
    ResNet-50); ``resnet50_augmix`` (DomainBed's default) replaces it by timm's
    ``resnet50.ram_in1k``. Unlike DomainBed we do not download the torchvision weights that the
    augmix model then discards. ``pretrained`` false builds random-init weights; ``pretrained_path``
    loads a local checkpoint. ``freeze_bn`` keeps BatchNorm statistics frozen across ``train()``."""

    def __init__(self, input_shape, hparams):
        super().__init__()
        use_pretrained = hparams.get("pretrained", True)
        local_path = hparams.get("pretrained_path")
        download = use_pretrained and not local_path
        if hparams["resnet50_augmix"]:
            self.network = weights.timm_model(TIMM_AUGMIX_RESNET, download)
            self.n_outputs = 2048
        else:
            arch = "resnet18" if hparams["resnet18"] else "resnet50"
            self.network, self.n_outputs = _torchvision_resnet(arch, download)
        if use_pretrained and local_path:
            weights.load_local_weights(self.network, local_path)
        if input_shape[0] != 3:
            self.network.conv1 = _adapt_input_channels(self.network.conv1, input_shape[0])
        self.network.fc = nn.Identity()
        self.freeze_bn = hparams["freeze_bn"]
        self.dropout = nn.Dropout(hparams["resnet_dropout"])
        self.activation = nn.Identity()
        self._freeze_bn_stats()

    def forward(self, x):
        return self.activation(self.dropout(self.network(x)))

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_bn_stats()
        return self

    def _freeze_bn_stats(self):
        if self.freeze_bn:
            for m in self.network.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()


def _torchvision_resnet(arch: str, download: bool):
    from dg_plugins import compat  # noqa: F401  (before torchvision)
    import torchvision

    name, weights_enum, n_outputs = _TORCHVISION_RESNETS[arch]
    chosen = None
    if download:
        chosen = getattr(torchvision.models, weights_enum).IMAGENET1K_V1  # DomainBed's weights
        weights.check_url_available(chosen.url, f"torchvision {name}")
    return getattr(torchvision.models, name)(weights=chosen), n_outputs


class ViT(nn.Module):
    """A timm Vision Transformer featurizer (dg_plugins addition; DomainBed only has DINOv2 via
    torch.hub). ``vit_arch`` names the timm model; with ``dinov2`` the model is timm's DINOv2
    ViT-B/14 and the feature is DomainBed's recipe: the class tokens of the last 4 blocks plus the
    mean patch token of the last block (spec 3.4). ``vit_attn_tune`` trains attention weights only.
    """

    def __init__(self, input_shape, hparams):
        super().__init__()
        if input_shape[0] != 3:
            raise ValueError(f"ViT featurizers need 3-channel input, got shape {input_shape}")
        use_pretrained = hparams.get("pretrained", True)
        local_path = hparams.get("pretrained_path")
        download = use_pretrained and not local_path
        self.dinov2 = bool(hparams["dinov2"])
        arch = "vit_base_patch14_dinov2.lvd142m" if self.dinov2 else hparams["vit_arch"]
        self.network = weights.timm_model(arch, download, num_classes=0, img_size=input_shape[1])
        if use_pretrained and local_path:
            weights.load_local_weights(self.network, local_path)
        width = self.network.num_features
        self.n_outputs = 5 * width if self.dinov2 else width
        self.dropout = nn.Dropout(hparams["vit_dropout"])
        if hparams["vit_attn_tune"]:
            for name, p in self.network.named_parameters():
                p.requires_grad_("attn" in name)

    def forward(self, x):
        if not self.dinov2:
            return self.dropout(self.network(x))
        blocks = self.network.get_intermediate_layers(x, n=4, return_prefix_tokens=True, norm=True)
        class_tokens = [prefix[:, 0] for _, prefix in blocks]
        mean_patch = blocks[-1][0].mean(dim=1)
        return self.dropout(torch.cat(class_tokens + [mean_patch], dim=-1))


def Featurizer(input_shape, hparams) -> nn.Module:
    """The featurizer for ``input_shape`` (spec 3.1): 28x28 -> MNIST_CNN; 224x224 -> ViT when
    ``vit`` else ResNet. Other shapes raise with the supported list."""
    input_shape = tuple(input_shape)
    if len(input_shape) == 3 and input_shape[1:3] == (28, 28):
        return MNIST_CNN(input_shape, hparams.get("mnist_cnn_width", 128))
    if len(input_shape) == 3 and input_shape[1:3] == (224, 224):
        return ViT(input_shape, hparams) if hparams["vit"] else ResNet(input_shape, hparams)
    raise NotImplementedError(
        f"no featurizer for input shape {input_shape}; supported: (C, 28, 28) -> MNIST CNN, "
        "(C, 224, 224) -> ResNet or ViT (hparam 'vit')"
    )


def Classifier(in_features: int, out_features: int, is_nonlinear: bool = False) -> nn.Module:
    """Linear head, or DomainBed's 3-layer MLP head (in -> in/2 -> in/4 -> out) when nonlinear."""
    if not is_nonlinear:
        return nn.Linear(in_features, out_features)
    return nn.Sequential(
        nn.Linear(in_features, in_features // 2), nn.ReLU(),
        nn.Linear(in_features // 2, in_features // 4), nn.ReLU(),
        nn.Linear(in_features // 4, out_features),
    )
