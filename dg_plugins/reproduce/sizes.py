"""The training in-split sizes behind an epoch-based setting's steps, from the image counts of
:mod:`dg_plugins.sweep.image_counts` (where the counts come from, and each job's splits). How a
setting's steps and costs follow from them: docs/reproduce.md."""

from __future__ import annotations

from dg_plugins.job.sizes import in_split_size
from dg_plugins.sweep.image_counts import dataset_sizes, official_list_sizes


def training_in_sizes(dataset: str, sources: list[int], hparams: dict, holdout: float,
                      data_dir: str | None) -> tuple[list[int], str]:
    """The training in-split size of each source environment, and where it comes from: under
    ``data_split: "official"`` the official train lists (:func:`official_list_sizes`), else
    DomainBed's random holdout of the environment's images."""
    if hparams.get("data_split") == "official":
        lists, origin = official_list_sizes(dataset, data_dir)
        return [lists["train"][e] for e in sources], origin
    sizes = dataset_sizes(dataset, data_dir)
    return ([in_split_size(sizes.counts[e], holdout) for e in sources],
            f"{sizes.source}; in-split = images - int(images x {holdout:g})")
