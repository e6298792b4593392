"""Why DMG trails ERM on RotatedMNIST5k at 201 steps (results/dmg_rotatedmnist5k.md).

ERM, DMG, DMG with lambda_O = 0 and DMG with only the ``fc`` mask, trained in one process with
the same seed and the same batches (default hparams, 5 source domains, test domain 0, 201 steps);
prints the CE of the last training batch, the accuracy on training domain 1 (15 degrees) and on
the held-out domain 0. About 3 minutes on one core::

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python results/tools/dmg_underfit_diagnostic.py
"""

import time

import torch

import dg_plugins.algorithms  # noqa: F401  (registers)
import dg_plugins.datasets  # noqa: F401
from dg_plugins import hparams as H
from dg_plugins.registry import ALGORITHMS, DATASETS

STEPS = 201
ds = DATASETS.get("RotatedMNIST5k")("builtin", [0], {"data_augmentation": False})
envs = [1, 2, 3, 4, 5]
variants = [("ERM", {}), ("DMG", {}), ("DMG", {"dmg_lambda_overlap": 0.0}),
            ("DMG", {"dmg_mask_layers": "fc"})]


def accuracy(algorithm, env):
    xs = torch.stack([ds[env][i][0] for i in range(len(ds[env]))])
    ys = torch.tensor([ds[env][i][1] for i in range(len(ds[env]))])
    return (algorithm.predict(xs).argmax(1) == ys).float().mean().item()


t0 = time.time()
for name, overrides in variants:
    torch.manual_seed(0)
    hp = H.default_hparams(name, "RotatedMNIST5k")
    hp.update(overrides)
    algorithm = ALGORITHMS.get(name)(ds.input_shape, ds.num_classes, len(envs), hp)
    g = torch.Generator().manual_seed(0)
    for step in range(STEPS):
        batches = []
        for e in envs:
            idx = torch.randint(len(ds[e]), (hp["batch_size"],), generator=g)
            items = [ds[e][int(i)] for i in idx]
            batches.append((torch.stack([x for x, _ in items]),
                            torch.tensor([y for _, y in items])))
        out = algorithm.update(batches)
    algorithm.eval()
    with torch.no_grad():
        test, train1 = accuracy(algorithm, 0), accuracy(algorithm, 1)
    print(f"{name} {overrides}: last-step ce {out.get('ce', out['loss']):.3f} "
          f"iou_hard {out.get('iou_hard', float('nan')):.3f} env1 (train) acc {train1:.3f} "
          f"env0 (held out) acc {test:.3f}  [{time.time() - t0:.0f}s]", flush=True)
