"""DomainNet-20: the 20-class DomainNet subset of the UDG protocol (DARLING, CVPR 2021; DisMAE,
ECCV 2024; classes from the DisMAE release's ``dataset/split.sh``), read from DomainBed's
DomainNet folder (docs/datasets.md)."""

from __future__ import annotations

import os

from dg_plugins.datasets.base import register_dataset
from dg_plugins.datasets.image_folder import DomainNet
from dg_plugins.layouts import DOMAINNET20_CLASSES as CLASSES  # folder names, sorted


@register_dataset()
class DomainNet20(DomainNet):
    """DomainNet keeping only :data:`CLASSES`, relabelled by their index there."""

    def __init__(self, root, test_envs, hparams):
        super().__init__(root, test_envs, hparams)
        index = {name: i for i, name in enumerate(CLASSES)}
        for folder, env in zip(self.environment_folders, self.datasets):
            present = set(self._find_class_folders(folder))
            if missing := [c for c in CLASSES if c not in present]:
                raise FileNotFoundError(
                    f"DomainNet-20 class folder(s) {missing} missing in "
                    f"{os.path.join(self.root, folder)}. {self.expected_layout()}")
            env.samples = [(path, index[env.classes[label]]) for path, label in env.samples
                           if env.classes[label] in index]
            env.targets = [label for _, label in env.samples]
            env.classes, env.class_to_idx = list(CLASSES), dict(index)
        self.classes, self.class_to_idx = list(CLASSES), dict(index)
        self.num_classes = len(CLASSES)
