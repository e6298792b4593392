"""``python -m dg_plugins.scripts.plot_gmoe_routing``: which expert each image patch is routed to,
for a few images of each domain (the expert-selection analysis of Li et al., ICLR 2023, GMoE), as
a PNG: one row per image, the image and, per MoE layer, the image overlaid with its patch grid
coloured by the first-choice expert of each patch token (class token not shown).

    # a trained job (DomainBed's model.pkl; the dataset and data_dir come from its args)
    python -m dg_plugins.scripts.plot_gmoe_routing --model OUT/model.pkl --out routing.png
    # a freshly built (random-router) model, e.g. to look at the initial routing
    python -m dg_plugins.scripts.plot_gmoe_routing --dataset RotatedMNIST5k --data_dir builtin \
        --out routing.png [--hparams JSON] [--images 3] [--envs 0 2 4] [--seed 0]

The model runs in eval mode (no gate noise); the routing shown is the router's choice, also for a
token that a capacity at evaluation (``gmoe_eval_capacity``) would drop. The images are the first
``--images`` of each environment after a seeded shuffle, without data augmentation.
"""

import sys

from dg_plugins.algorithms.gmoe_routing import (  # noqa: F401  (surface)
    build_parser, load_model, main, plot_routing, routing_maps, sample_images)

if __name__ == "__main__":
    sys.exit(main())
