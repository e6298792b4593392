"""IP/OOP evaluation by CLIP alignment (Teterwak, Saito, Tsiligkaridis, Plummer, Saenko, "Is
Large-scale Pretraining the Secret to Good Domain Generalization?", ICLR 2025, arXiv 2412.02856).

An evaluation protocol, not a training algorithm: every image of a target domain gets an
AlignmentScore, the raw cosine between its OpenCLIP image embedding and the text embedding of
``"A photo of {class}."`` for its true class (:mod:`.scoring`); a rule (:mod:`.rule`) splits the
domain into In-Pretraining (IP, well aligned) and Out-of-Pretraining (OOP) images, optionally
dropping outliers; training and the evaluation-only command then report accuracy on each subset
(``env{i}_{in,out}_{ip,oop}_acc`` and ``_count``), and collect_results prints IP and OOP tables.

Modules: :mod:`.scoring` (open_clip scorer), :mod:`.cache` (persistent score cache),
:mod:`.scores_file` (the CSV contract), :mod:`.provenance` (is a score file the one of this data
copy and of the model a rule needs), :mod:`.rule` (threshold, cleaning cuts, presets),
:mod:`.wrapper` (dataset wrapper, :func:`env_subsets`), :mod:`.importers` (the authors' released
splits), :mod:`.plots` (accuracy vs score bins, histograms). Only the light modules are imported
here; ``scoring`` (torch, open_clip) and ``plots`` (matplotlib) load when imported.
"""

from dg_plugins.alignment.rule import (DEFAULT_THRESHOLD, PRESETS, SplitRule, lopsided_warnings,
                                       resolve_rule)
from dg_plugins.alignment.scores_file import ScoreTable, read_scores, write_scores
from dg_plugins.alignment.wrapper import AlignmentSplit, env_subsets, image_items

__all__ = [
    "DEFAULT_THRESHOLD", "PRESETS", "SplitRule", "lopsided_warnings", "resolve_rule",
    "ScoreTable", "read_scores", "write_scores", "AlignmentSplit", "env_subsets", "image_items",
]
