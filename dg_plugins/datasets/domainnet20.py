"""DomainNet-20: the 20-class DomainNet subset of the UDG protocol (DARLING, CVPR 2021; DisMAE,
ECCV 2024), read from DomainBed's DomainNet layout ``<data_dir>/domain_net/<domain>/<class>/``.

The classes are those of the DisMAE release's ``dataset/split.sh`` (as DomainNet class-folder
names); every other class folder is ignored. Environments and their order are DomainNet's
(``clip, info, paint, quick, real, sketch``), so the protocol's two 3+3 splits are
``--test_env_sets 0,1,3`` (train on painting, real, sketch; test on clipart, infograph,
quickdraw) and ``2,4,5`` (the reverse). Labels are the index of the class in :data:`CLASSES`
(sorted). The release evaluates the targets on an 80% split; DomainBed's ``env{t}_in_acc`` with
``--holdout_fraction 0.2`` is the same share.
"""

from __future__ import annotations

import os

from dg_plugins.datasets.base import register_dataset
from dg_plugins.datasets.image_folder import DomainNet
from dg_plugins.layouts import DOMAINNET20_CLASSES

#: DomainNet-20's classes (DomainNet folder names), sorted (from :mod:`dg_plugins.layouts`).
CLASSES = DOMAINNET20_CLASSES


@register_dataset()
class DomainNet20(DomainNet):
    """DomainNet restricted to :data:`CLASSES` (see the module docstring): DomainNet is read as
    usual, then every environment keeps only the samples of the 20 classes, relabelled by their
    index in :data:`CLASSES`. A domain lacking one of the class folders is an error."""

    def __init__(self, root, test_envs, hparams):
        super().__init__(root, test_envs, hparams)
        index = {name: i for i, name in enumerate(CLASSES)}
        for folder, env in zip(self.environment_folders, self.datasets):
            present = set(self._find_class_folders(folder))
            missing = [c for c in CLASSES if c not in present]
            if missing:
                raise FileNotFoundError(
                    f"DomainNet-20 class folder(s) {missing} missing in "
                    f"{os.path.join(self.root, folder)}. {self.expected_layout()}")
            env.samples = [(path, index[env.classes[label]]) for path, label in env.samples
                           if env.classes[label] in index]
            env.targets = [label for _, label in env.samples]
            env.classes, env.class_to_idx = list(CLASSES), dict(index)
        self.classes, self.class_to_idx = list(CLASSES), dict(index)
        self.num_classes = len(CLASSES)
