"""``python -m dg_plugins.scripts.plot_gmoe_routing``: the first-choice expert of each image
patch, per MoE layer, for a few images per domain (GMoE's expert-selection analysis, Li et al.,
ICLR 2023), of a trained ``--model`` or a fresh one (:mod:`dg_plugins.algorithms.gmoe_routing`)."""

import sys

from dg_plugins.algorithms.gmoe_routing import (  # noqa: F401  (surface)
    build_parser, load_model, main, plot_routing, routing_maps, sample_images)

if __name__ == "__main__":
    sys.exit(main())
