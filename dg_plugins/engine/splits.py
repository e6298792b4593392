"""What a train job evaluates: every environment's in/out(/uda) split, named as DomainBed's
``domainbed/scripts/train.py`` names them, the named subsets of test environments (the IP/OOP
split), and the accuracy keys of one record.

A dataset may define its own in/out split of an environment (e.g. PACS's official train/val
lists): ``dataset.predefined_split(env_index) -> (in_indices, out_indices) | None``. When it
returns a pair, :class:`Splits` uses it for that environment instead of DomainBed's random
holdout (``--holdout_fraction`` then does not apply there; the uda holdout of a test environment
is still drawn from its in-split). A test environment's out-split may overlap its in-split (PACS's
official ``test`` list holds every image, its ``crossval`` list a subset): neither is trained on,
so the target's accuracy stays the release's whole-list accuracy; a training environment's may
not (its validation items would be trained on)."""

from __future__ import annotations

import numpy as np

from dg_plugins.engine import alignment_flags, data
from dg_plugins.seeds import seed_hash


def evaluation_subsets(args, dataset) -> dict[int, dict[str, list[int]]]:
    """Named index subsets of test environments to evaluate besides the whole splits:
    ``{env index: {subset name: [item indices of that environment]}}``. Today: the IP/OOP split
    by CLIP alignment score (``--alignment_scores``, see :mod:`dg_plugins.alignment`), under the
    rule ``--alignment_threshold`` / ``--alignment_preset``, from a file that must have been
    scored by ``--alignment_model`` / ``--alignment_pretrained`` when given."""
    if getattr(args, "alignment_scores", None) is None:
        error = alignment_flags.rule_without_scores(args)
        if error is not None:
            raise ValueError(error)
        return {}
    from dg_plugins import alignment

    return alignment.env_subsets(dataset, args.test_envs, args.alignment_scores,
                                 threshold=args.alignment_threshold,
                                 preset=args.alignment_preset, data_dir=args.data_dir,
                                 model=getattr(args, "alignment_model", None),
                                 pretrained=getattr(args, "alignment_pretrained", None))


class Splits:
    """Every environment's in/out(/uda) split, named as DomainBed's train.py names them, and the
    named subsets of test environments to evaluate (``subsets``, see :func:`evaluation_subsets`).
    """

    def __init__(self, dataset, args, hparams, subsets=None):
        self.in_splits, self.out_splits, self.uda_splits = [], [], []
        self.subsets = subsets or {}
        bad = [i for i in self.subsets if i not in args.test_envs]
        if bad:
            raise ValueError(f"evaluation subsets are defined for environments {bad}, which are "
                             f"not test environments ({args.test_envs})")

        def weights(split):
            return data.class_balanced_weights(split) if hparams["class_balanced"] else None

        predefined = getattr(dataset, "predefined_split", None)
        for env_i, env in enumerate(dataset):
            pair = predefined(env_i) if predefined is not None else None
            if pair is not None:
                in_, out = predefined_splits(env, pair, env_i,
                                             test_env=env_i in args.test_envs)
                print(f"Splits: env{env_i} uses the dataset's predefined split ({len(in_)} in, "
                      f"{len(out)} out) instead of the random holdout (--holdout_fraction)")
            else:
                out, in_ = data.split_dataset(env, int(len(env) * args.holdout_fraction),
                                              seed_hash(args.trial_seed, env_i))
            uda = None
            if env_i in args.test_envs:
                uda, in_ = data.split_dataset(in_, int(len(in_) * args.uda_holdout_fraction),
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
        """Boolean masks over ``split``'s items for each named subset of environment ``env``."""
        if env is None or env not in self.subsets:
            return {}
        positions = data.env_indices(split)
        return {name: np.isin(positions, np.asarray(indices, dtype=np.int64))
                for name, indices in self.subsets[env].items()}


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
    return data.SplitDataset(env, in_idx), data.SplitDataset(env, out_idx)


def eval_seed(name: str) -> int:
    """The augmentation seed of split ``name``'s evaluation batches (``env0_out``, ...): the same
    in every job and every re-evaluation, so an augmented split's accuracy is a function of the
    model alone (:func:`dg_plugins.engine.data.eval_batches`)."""
    return seed_hash("eval", name)


def evaluate(algorithm, splits: Splits, device, num_workers: int = 0) -> dict[str, float]:
    """Accuracy keys of one record: ``env{i}_{in,out,uda}_acc`` for every split (DomainBed's), and
    for every named subset of a test environment ``env{i}_{in,out}_{name}_acc`` (NaN when the
    subset is empty) and ``env{i}_{in,out}_{name}_count``. Batches of augmented splits are seeded
    by (split, batch index) (:func:`eval_seed`); one loader's workers make them all."""
    named = splits.eval_named()
    masks = [splits.subset_masks(split, env) for _, split, env in named]
    results = data.accuracies(algorithm, [(split, eval_seed(name), subsets) for (name, split, _),
                                          subsets in zip(named, masks)], device,
                              num_workers=num_workers)
    out = {}
    for (name, _, _), subsets, accs in zip(named, masks, results):
        out[name + "_acc"] = accs[""]
        for subset, mask in subsets.items():
            out[f"{name}_{subset}_acc"] = accs[subset]
            out[f"{name}_{subset}_count"] = int(mask.sum())
    return out
