"""The commands, ``python -m dg_plugins.scripts.NAME``: thin entry points, each imported on its
own (nothing imports them)."""

__all__ = ["alignment_eval", "alignment_scores", "benchmark", "check_algorithm", "check_data",
           "collect_results", "domainbed", "download", "plot_alignment", "plot_gmoe_routing",
           "reproduce", "sweep", "train"]
