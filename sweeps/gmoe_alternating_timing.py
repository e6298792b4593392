"""Alternating in-process timing of GMoE vs ERM_ViT updates (default hparams, random init).

    python sweeps/gmoe_alternating_timing.py DATASET "(C,H,W)" NUM_CLASSES BATCH DOMAINS REPEATS
"""
import ast
import sys

import torch

import dg_plugins.algorithms  # noqa
from dg_plugins import hparams as H
from dg_plugins.registry import ALGORITHMS
from dg_plugins.runtime import alternating_medians
dataset, shape, classes, batch, domains, reps = sys.argv[1], ast.literal_eval(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
algs = {}
for name in ("ERM_ViT", "GMoE"):
    hp = H.default_hparams(name, dataset); hp["pretrained"] = False
    torch.manual_seed(0); algs[name] = ALGORITHMS.get(name)(shape, classes, domains, hp)
g = torch.Generator().manual_seed(0)
b = [(torch.randn(batch, *shape, generator=g), torch.randint(0, classes, (batch,), generator=g)) for _ in range(domains)]
med = alternating_medians({k: (lambda a=a: a.update(b)) for k, a in algs.items()}, reps, 1, "cpu")
print(f"{dataset} {shape} batch {batch}x{domains}, {reps} alternating repeats after 1 warm-up, torch threads {torch.get_num_threads()}:",
      ", ".join(f"{k} {1000*m:.1f} ms" for k, m in med.items()), f"ratio {med['GMoE']/med['ERM_ViT']:.3f}")
