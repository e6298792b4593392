"""The IP/OOP split-rule flags, defined once for train, sweep (which passes them to every job) and
alignment_eval (see :mod:`dg_plugins.alignment`). Torch-free: the sweep's enumeration never imports
torch."""

from __future__ import annotations

#: The IP/OOP evaluation's train flags: the score file, then the rule and the model it must fit
#: (each enters a job's args only when given).
ALIGNMENT_ARGS = ("alignment_scores", "alignment_threshold", "alignment_preset",
                  "alignment_model", "alignment_pretrained")


def add_rule_arguments(group) -> None:
    """``--alignment_threshold``, ``--alignment_preset`` (the rule splitting a score file's
    images into IP and OOP) and ``--alignment_model`` / ``--alignment_pretrained`` (the CLIP model
    the score file must come from)."""
    group.add_argument("--alignment_threshold", type=float, default=None,
                       help="IP if score >= threshold, else OOP (default 0.4)")
    group.add_argument("--alignment_preset", type=str, default=None,
                       help="a named split rule, e.g. teterwak2025 (cleaning cuts + threshold)")
    group.add_argument("--alignment_model", type=str, default=None,
                       help="the open_clip model the score file must have been made with (e.g. "
                       "ViT-B-16); a file scored by another one is an error")
    group.add_argument("--alignment_pretrained", type=str, default=None,
                       help="the pretrained tag the score file must have been made with (e.g. "
                       "laion400m_e32); a file scored with other weights is an error")
