"""IP/OOP evaluation by CLIP alignment (Teterwak et al., ICLR 2025, arXiv 2412.02856): score each
target image, split by a rule, report accuracy per subset (docs/methods/alignment.md). Torch-free;
``scoring`` (torch, open_clip) is imported on its own."""

from dg_plugins.alignment.rule import (DEFAULT_THRESHOLD, PRESETS, SplitRule,  # the split rule
                                       lopsided_warnings, resolve_rule)
from dg_plugins.alignment.scores_file import (ScoreCache, ScoreTable,  # the CSV, the cache
                                               read_scores, write_scores)
from dg_plugins.alignment.provenance import check_data, check_model  # the right file?
from dg_plugins.alignment.wrapper import (AlignmentSplit, env_subsets,  # subsets, releases
                                          image_items, import_score_arrays, import_split_dirs)
from dg_plugins.alignment.plots import binned_accuracy, plot_alignment  # Fig. 2
from dg_plugins.alignment.reevaluate import (JobFiles, RebuiltJob,  # trained jobs again
                                             reevaluate_jobs, update_records)
from dg_plugins.alignment.score_command import check_flags, score_and_write  # the command
