"""``python -m dg_plugins.scripts.alignment_scores``: CLIP AlignmentScore of every image of a
dataset, written as a score file for ``train --alignment_scores`` and ``alignment_eval``.

    python -m dg_plugins.scripts.alignment_scores --dataset PACS --data_dir /data \
        [--envs 0 3] [--model ViT-B-16] [--pretrained laion400m_e32 | /path/ckpt.bin | none] \
        [--prompt "A photo of {}."] [--transform dataset | clip] [--batch_size 64] \
        [--device cuda] [--out scores.csv] [--alignment_preset teterwak2025 | --threshold 0.4]

Defaults are the authors' (OpenCLIP ViT-B-16 laion400m_e32, prompt "A photo of {}." with the
class folder name, the dataset's evaluation transform; see :mod:`dg_plugins.alignment.scoring`).
The file format is described in :mod:`dg_plugins.alignment.scores_file`. Scores are cached (see
:mod:`dg_plugins.alignment.cache`): a rerun with the same setting reads them (``--no_cache`` to
recompute, ``--cache_dir`` to move the cache). After writing, it prints the count and fraction of
IP / OOP / dropped images per environment under the chosen rule (``--threshold`` default 0.4,
``--drop_below``, ``--drop_above``, or ``--alignment_preset teterwak2025``: drop < 0.15 and >
0.40, IP at 0.21, the paper's split; ``--preset`` is a deprecated spelling of it). The rule is not
stored in the file: train and alignment_eval take it.

The header records which data copy was scored (a fingerprint per environment) and which model
scored it; train and alignment_eval reject the file for another copy of the data, or for a rule
defined for another model (see :mod:`dg_plugins.alignment.provenance`). A local checkpoint file
of a tag's weights (the offline way) is declared with ``--pretrained_tag TAG``, so that a rule
defined for that tag accepts its scores.

Importing the authors' released splits instead of scoring (see
:mod:`dg_plugins.alignment.importers`): ``--import_score_arrays DIR`` (``<domain>_in.npy`` /
``_out.npy`` arrays of (score, is_correct) rows, with ``--holdout_fraction`` / ``--trial_seed``
of the run that wrote them) or ``--import_split_dirs IP_DIR OOP_DIR`` (the IP and OOP copies of
the dataset; the file then carries fixed subsets).

Works for every image dataset whose environments list their files: PACS, VLCS, OfficeHome,
TerraIncognita, DomainNet, the generic ImageFolder (``--dataset ImageFolder --data_dir
<domains folder>``), and registered ones (``--import`` plugin modules or ``$DG_PLUGINS_IMPORT``).
"""

import sys

from dg_plugins.alignment.score_command import (  # noqa: F401  (the command's surface)
    UNAUGMENTED, add_preset_flag, build_parser, check_flags, resolve_envs, resolve_preset_flag,
    score_and_write)
from dg_plugins.help_text import short_usage_errors


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.preset = resolve_preset_flag(args, parser)
    from dg_plugins.plugins import build_dataset
    from dg_plugins.train.run import user_errors

    try:
        model, rule = check_flags(args)
        dataset = build_dataset(args.dataset, args.data_dir, UNAUGMENTED, args.plugins)
        score_and_write(args, dataset, model, rule)
    except user_errors() as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    with short_usage_errors():  # its parser (dg_plugins.alignment.score_command) is argparse's
        sys.exit(main())
