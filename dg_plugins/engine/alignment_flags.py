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


def rule_without_scores(args) -> str | None:
    """The error of rule or model flags given without ``--alignment_scores`` (None when there is
    none to report); ``args``: a namespace holding any of :data:`ALIGNMENT_ARGS`."""
    given = [f"--{name}" for name in ALIGNMENT_ARGS[1:] if getattr(args, name, None) is not None]
    if getattr(args, "alignment_scores", None) is not None or not given:
        return None
    return (f"{' / '.join(given)} need --alignment_scores FILE (a score file from python -m "
            "dg_plugins.scripts.alignment_scores)")
