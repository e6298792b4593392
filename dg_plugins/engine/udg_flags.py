"""The UDG protocol's length and split flags, shared by train and sweep (which passes them to every
job; see :mod:`dg_plugins.engine.udg_jobs`). Torch-free: the sweep's enumeration never imports torch."""

from __future__ import annotations


def add_protocol_arguments(group) -> None:
    """The flags that set the protocol's lengths in epochs and its split (train's and sweep's,
    which passes them to every job)."""
    group.add_argument("--udg_pretrain_epochs", type=float, default=None,
                       help="pretrain for this many epochs of the unlabelled source data instead "
                       "of --pretrain_steps: steps = ceil(E x pretraining images / (batch per "
                       "domain x domains)), printed (DisMAE's release: 501)")
    group.add_argument("--udg_ft_epochs", type=float, default=None,
                       help="fine-tune for this many epochs of the labelled data instead of "
                       "--steps: steps = ceil(E x labelled images of the source environments / "
                       "(batch per domain x domains)), printed (DisMAE's release: 51)")
    group.add_argument("--udg_split", choices=("domainbed", "release"), default=None,
                       help="domainbed (default): pretrain on the source in-splits, label a "
                       "fraction of them; release (DisMAE's dataloader.py): pretrain on 99%% of "
                       "each source environment and label a fraction of its 90%% in-split "
                       "(needs --holdout_fraction 0.1; the 10%% out-split stays the validation "
                       "data of model selection)")
