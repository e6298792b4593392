"""``python -m dg_plugins.scripts.alignment_scores --dataset D --data_dir DIR``: the CLIP
AlignmentScore of every image of a dataset, as a score file for ``train --alignment_scores`` and
``alignment_eval`` (cached; the header records the data copy and the model), or the authors'
released splits imported. Format, rules, flags and defaults: docs/methods/alignment.md."""

import sys

from dg_plugins.alignment.score_command import (UNAUGMENTED, build_parser, check_flags,
                                                 resolve_preset_flag, score_and_write)
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
