"""A job's splits (``domainbed/scripts/train.py``): every environment's in/out(/uda) split, by
DomainBed's random holdout or a dataset's predefined split, class-balanced sampling weights, and
the subsets of test environments to evaluate (IP/OOP). Splits are index views."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from dg_plugins.seeds import seed_hash
from dg_plugins.job.flags import flag
from dg_plugins.job.selection import OUTSIDE_IN_SUBSET
from dg_plugins.job.sizes import holdout_size


class SplitDataset(Dataset):
    def __init__(self, underlying: Dataset, keys):
        self.underlying, self.keys = underlying, list(keys)

    def __getitem__(self, index):
        return self.underlying[self.keys[index]]

    def __len__(self):
        return len(self.keys)

    def pixels(self, index):
        return self.underlying.pixels(self.keys[index])

    def finisher(self):
        method = getattr(unwrap(self)[0], "finisher", None)
        return method(env_indices(self)) if method is not None else None


def finisher(dataset):
    """``finisher(pixels, device, seed)``: what turns a batch of ``dataset.pixels(i)`` into the
    model's input on the device (an image folder's); None when items are only whole."""
    method = getattr(dataset, "finisher", None)
    return method() if method is not None else None


def unwrap(dataset: Dataset):
    """``(the dataset under nested SplitDatasets, the positions there or None)``."""
    index = None
    while isinstance(dataset, SplitDataset):
        keys = np.asarray(dataset.keys, dtype=np.int64)
        index = keys if index is None else keys[index]
        dataset = dataset.underlying
    return dataset, index


def split_dataset(dataset: Dataset, n: int, seed: int = 0):
    """``(first n, rest)`` of a ``RandomState(seed)`` shuffle (``misc.split_dataset``)."""
    if n > len(dataset):
        raise ValueError(f"cannot hold out {n} of {len(dataset)} samples")
    keys = np.random.RandomState(seed).permutation(len(dataset)).tolist()
    return SplitDataset(dataset, keys[:n]), SplitDataset(dataset, keys[n:])


def env_indices(dataset: Dataset) -> np.ndarray:
    """The positions of ``dataset``'s items in the environment under it."""
    root, index = unwrap(dataset)
    return np.arange(len(root)) if index is None else index


def tensor_view(dataset: Dataset):
    """``(tensors, index)`` when ``dataset`` is a (nested) split of a TensorDataset, else None."""
    root, index = unwrap(dataset)
    if not isinstance(root, TensorDataset):
        return None
    return root.tensors, torch.arange(len(root)) if index is None else torch.from_numpy(index)


def class_balanced_weights(dataset: Dataset) -> torch.Tensor:
    """Weights ``1 / (count[c] * classes)`` (``misc.make_weights_for_balanced_classes``)."""
    view = tensor_view(dataset)
    labels = (view[0][1][view[1]] if view is not None
              else torch.as_tensor([int(dataset[i][1]) for i in range(len(dataset))]))
    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (counts[inverse].double() * len(classes))


class Splits:
    """Every environment's in/out(/uda) split and the ``subsets`` of ``--alignment_scores``'s
    IP/OOP split (``{test env: {subset name: [item indices]}}``); a dataset's
    ``predefined_split(env) -> (in, out) | None`` replaces the random holdout (a test environment's
    may overlap)."""

    def __init__(self, dataset, args, hparams):
        self.in_splits, self.out_splits, self.uda_splits, self.subsets = [], [], [], {}
        if flag(args, "alignment_scores") is not None:
            from dg_plugins import alignment

            self.subsets = alignment.env_subsets(
                dataset, args.test_envs, args.alignment_scores, threshold=args.alignment_threshold,
                data_dir=args.data_dir, preset=args.alignment_preset,
                model=flag(args, "alignment_model"), pretrained=flag(args, "alignment_pretrained"))

        def weights(split):
            return class_balanced_weights(split) if hparams["class_balanced"] else None

        predefined = getattr(dataset, "predefined_split", None)
        for env_i, env in enumerate(dataset):
            pair = predefined(env_i) if predefined is not None else None
            if pair is not None:
                in_, out = predefined_splits(env, pair, env_i, test_env=env_i in args.test_envs)
                print(f"Splits: env{env_i} uses the dataset's predefined split ({len(in_)} in, "
                      f"{len(out)} out) instead of the random holdout (--holdout_fraction)")
            else:
                out, in_ = split_dataset(env, holdout_size(len(env), args.holdout_fraction),
                                              seed_hash(args.trial_seed, env_i))
            if env_i in args.test_envs:
                uda, in_ = split_dataset(in_, holdout_size(len(in_), args.uda_holdout_fraction),
                                         seed_hash(args.trial_seed, env_i))
                if len(uda):
                    self.uda_splits.append((uda, weights(uda)))
            self.in_splits.append((in_, weights(in_)))
            self.out_splits.append((out, weights(out)))
        if args.task == "domain_adaptation" and not self.uda_splits:
            raise ValueError("Not enough unlabeled samples for domain adaptation: set "
                             "--uda_holdout_fraction > 0")

    def eval_named(self):
        """``(name, split, env index)``: all in, all out, then uda (env index None)."""
        return ([(f"env{i}_in", s, i) for i, (s, _) in enumerate(self.in_splits)]
                + [(f"env{i}_out", s, i) for i, (s, _) in enumerate(self.out_splits)]
                + [(f"env{i}_uda", s, None) for i, (s, _) in enumerate(self.uda_splits)])

    def subset_masks(self, split, env: int | None) -> dict[str, np.ndarray]:
        """A boolean mask over ``split`` per subset of ``env``; an out split sharing items with
        the in split also gets each cut to the items outside it (``OUTSIDE_IN_SUBSET``)."""
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
    """``(in, out)`` of ``env`` from a ``predefined_split`` pair, checked."""
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise ValueError(f"predefined_split({env_index}) must return (in_indices, out_indices) or "
                         f"None, got {type(pair).__name__}")
    in_idx, out_idx = (np.asarray(p, dtype=np.int64).reshape(-1).tolist() for p in pair)
    if bad := [i for i in in_idx + out_idx if not 0 <= i < len(env)]:
        raise ValueError(f"predefined_split({env_index}) names items {bad[:5]} outside the "
                         f"environment's {len(env)} items")
    if not test_env and (shared := set(in_idx) & set(out_idx)):
        raise ValueError(f"predefined_split({env_index}) puts items {sorted(shared)[:5]} in both "
                         f"the in- and the out-split of training environment {env_index}: its "
                         "validation items would be trained on; make the two lists disjoint")
    if not in_idx:
        raise ValueError(f"predefined_split({env_index}) gives an empty in-split")
    return SplitDataset(env, in_idx), SplitDataset(env, out_idx)
