"""A job's splits (``domainbed/scripts/train.py``): every environment's in/out(/uda) split, as
DomainBed's random holdout (``misc.split_dataset``) or a dataset's own predefined split
(:class:`Splits`), the sampling weights of class-balanced training, and the named subsets of test
environments to evaluate (the IP/OOP split). Splits are index views (:class:`SplitDataset`)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from dg_plugins.seeds import seed_hash
from dg_plugins.job.flags import flag
from dg_plugins.job.selection import OUTSIDE_IN_SUBSET
from dg_plugins.job.sizes import holdout_size


class SplitDataset(Dataset):
    """The items ``keys`` of ``underlying`` (an index-remapping view)."""

    def __init__(self, underlying: Dataset, keys):
        self.underlying = underlying
        self.keys = list(keys)

    def __getitem__(self, index):
        return self.underlying[self.keys[index]]

    def __len__(self):
        return len(self.keys)

    def pixels(self, index):
        """The underlying item's uint8 pixels and label (:func:`finisher`)."""
        return self.underlying.pixels(self.keys[index])

    def finisher(self):
        """The finisher of this split's items in the dataset under it (:func:`finisher`)."""
        method = getattr(root_dataset(self), "finisher", None)
        return method(env_indices(self)) if method is not None else None


def finisher(dataset):
    """What turns a batch of ``dataset``'s uint8 item pixels (``dataset.pixels(i)``, collated)
    into the model's input on the job's device, ``finisher(pixels, device, seed)`` (an
    image-folder environment's, through splits:
    :meth:`~dg_plugins.datasets.image_folder.ImageFolderEnvironment.finisher`: the exact
    ToTensor + Normalize table, or with ``--augment_on device`` the device augmentation, seeded by
    the batch's seed); None when its items are only made whole (``dataset[i]``)."""
    method = getattr(dataset, "finisher", None)
    return method() if method is not None else None


def root_dataset(dataset: Dataset) -> Dataset:
    """The dataset under a (possibly nested) :class:`SplitDataset` (:func:`env_indices` gives
    the positions there)."""
    while isinstance(dataset, SplitDataset):
        dataset = dataset.underlying
    return dataset


def split_dataset(dataset: Dataset, n: int, seed: int = 0):
    """``(first n, rest)`` of a ``RandomState(seed)`` shuffle of the indices (``misc.split_dataset``); train.py
    uses the first part as the holdout ("out") split."""
    if n > len(dataset):
        raise ValueError(f"cannot hold out {n} of {len(dataset)} samples")
    keys = np.random.RandomState(seed).permutation(len(dataset)).tolist()
    return SplitDataset(dataset, keys[:n]), SplitDataset(dataset, keys[n:])


def env_indices(dataset: Dataset) -> np.ndarray:
    """The positions, in the underlying environment dataset, of the items of ``dataset`` (a
    possibly nested :class:`SplitDataset`; a plain dataset maps to ``0..len-1``)."""
    index = None
    while isinstance(dataset, SplitDataset):
        keys = np.asarray(dataset.keys, dtype=np.int64)
        index = keys if index is None else keys[index]
        dataset = dataset.underlying
    return np.arange(len(dataset)) if index is None else index


def tensor_view(dataset: Dataset):
    """``(tensors, index)`` when ``dataset`` is a (nested) split of a TensorDataset, else None."""
    index = None
    while isinstance(dataset, SplitDataset):
        keys = torch.as_tensor(dataset.keys, dtype=torch.long)
        index = keys if index is None else keys[index]
        dataset = dataset.underlying
    if not isinstance(dataset, TensorDataset):
        return None
    if index is None:
        index = torch.arange(len(dataset))
    return dataset.tensors, index


def class_balanced_weights(dataset: Dataset) -> torch.Tensor:
    """Per-sample weights ``1 / (count[c] * n_classes_present)`` (``misc.make_weights_for_balanced_classes``), summing to 1."""
    view = tensor_view(dataset)
    labels = (view[0][1][view[1]] if view is not None
              else torch.as_tensor([int(dataset[i][1]) for i in range(len(dataset))]))
    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (counts[inverse].double() * len(classes))


def evaluation_subsets(args, dataset) -> dict[int, dict[str, list[int]]]:
    """Named index subsets of test environments to evaluate besides the whole splits:
    ``{env index: {subset name: [item indices of that environment]}}``. Today: the IP/OOP split
    by CLIP alignment score (``--alignment_scores``, see :mod:`dg_plugins.alignment`), under the
    rule ``--alignment_threshold`` / ``--alignment_preset``, from a file that must have been
    scored by ``--alignment_model`` / ``--alignment_pretrained`` when given."""
    if flag(args, "alignment_scores") is None:
        return {}
    from dg_plugins import alignment

    return alignment.env_subsets(dataset, args.test_envs, args.alignment_scores,
                                 threshold=args.alignment_threshold,
                                 preset=args.alignment_preset, data_dir=args.data_dir,
                                 model=flag(args, "alignment_model"),
                                 pretrained=flag(args, "alignment_pretrained"))


class Splits:
    """Every environment's in/out(/uda) split, named as DomainBed's train.py names them, and the
    named subsets of test environments to evaluate (``subsets``, see :func:`evaluation_subsets`).

    A dataset may define its own in/out split of an environment (e.g. PACS's official train/val
    lists): ``dataset.predefined_split(env_index) -> (in_indices, out_indices) | None``. When it
    returns a pair, that environment uses it instead of DomainBed's random holdout
    (``--holdout_fraction`` does not apply there; the uda holdout of a test environment is still
    drawn from its in-split). A test environment's out-split may overlap its in-split (PACS's
    official ``test`` list holds every image, its ``crossval`` list a subset): neither is trained
    on, so the target's accuracy stays the release's whole-list accuracy; a training
    environment's may not (its validation items would be trained on)."""

    def __init__(self, dataset, args, hparams, subsets=None):
        self.in_splits, self.out_splits, self.uda_splits = [], [], []
        self.subsets = subsets or {}
        bad = [i for i in self.subsets if i not in args.test_envs]
        if bad:
            raise ValueError(f"evaluation subsets are defined for environments {bad}, which are "
                             f"not test environments ({args.test_envs})")

        def weights(split):
            return class_balanced_weights(split) if hparams["class_balanced"] else None

        predefined = getattr(dataset, "predefined_split", None)
        for env_i, env in enumerate(dataset):
            pair = predefined(env_i) if predefined is not None else None
            if pair is not None:
                in_, out = predefined_splits(env, pair, env_i,
                                             test_env=env_i in args.test_envs)
                print(f"Splits: env{env_i} uses the dataset's predefined split ({len(in_)} in, "
                      f"{len(out)} out) instead of the random holdout (--holdout_fraction)")
            else:
                out, in_ = split_dataset(env, holdout_size(len(env), args.holdout_fraction),
                                              seed_hash(args.trial_seed, env_i))
            uda = None
            if env_i in args.test_envs:
                uda, in_ = split_dataset(in_, holdout_size(len(in_), args.uda_holdout_fraction),
                                              seed_hash(args.trial_seed, env_i))
            self.in_splits.append((in_, weights(in_)))
            self.out_splits.append((out, weights(out)))
            if uda is not None and len(uda):
                self.uda_splits.append((uda, weights(uda)))
        if args.task == "domain_adaptation" and not self.uda_splits:
            raise ValueError("Not enough unlabeled samples for domain adaptation: set "
                             "--uda_holdout_fraction > 0")

    def eval_named(self):
        """``(name, split, env index)`` in DomainBed's order: all in, all out, then uda by
        position (uda splits have no env index here: None)."""
        named = [(f"env{i}_in", s, i) for i, (s, _) in enumerate(self.in_splits)]
        named += [(f"env{i}_out", s, i) for i, (s, _) in enumerate(self.out_splits)]
        named += [(f"env{i}_uda", s, None) for i, (s, _) in enumerate(self.uda_splits)]
        return named

    def subset_masks(self, split, env: int | None) -> dict[str, np.ndarray]:
        """Boolean masks over ``split``'s items for each named subset of environment ``env``; for
        the out split of an environment whose in split shares items with it (a test
        environment's predefined split), also each subset cut down to the items outside the in
        split (:data:`~dg_plugins.job.selection.OUTSIDE_IN_SUBSET`), for pooling the two."""
        if env is None or env not in self.subsets:
            return {}
        positions = env_indices(split)
        masks = {name: np.isin(positions, np.asarray(indices, dtype=np.int64))
                 for name, indices in self.subsets[env].items()}
        if split is self.out_splits[env][0]:
            outside = ~np.isin(positions, env_indices(self.in_splits[env][0]))
            if not outside.all():
                masks.update({OUTSIDE_IN_SUBSET.format(subset=name): mask & outside
                              for name, mask in list(masks.items())})
        return masks


def predefined_splits(env, pair, env_index: int, test_env: bool = False):
    """``(in split, out split)`` of ``env`` from a dataset's ``predefined_split`` pair of index
    lists, after checking them (in range, a non-empty in-split, and disjoint unless ``env`` is a
    test environment, whose splits are only evaluated)."""
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise ValueError(f"predefined_split({env_index}) must return (in_indices, out_indices) or "
                         f"None, got {type(pair).__name__}")
    in_idx, out_idx = (np.asarray(p, dtype=np.int64).reshape(-1).tolist() for p in pair)
    bad = [i for i in in_idx + out_idx if not 0 <= i < len(env)]
    if bad:
        raise ValueError(f"predefined_split({env_index}) names items {bad[:5]} outside the "
                         f"environment's {len(env)} items")
    shared = set(in_idx) & set(out_idx)
    if shared and not test_env:
        raise ValueError(f"predefined_split({env_index}) puts items {sorted(shared)[:5]} in both "
                         f"the in- and the out-split of training environment {env_index}: its "
                         "validation items would be trained on; make the two lists disjoint")
    if not in_idx:
        raise ValueError(f"predefined_split({env_index}) gives an empty in-split")
    return SplitDataset(env, in_idx), SplitDataset(env, out_idx)
