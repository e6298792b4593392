"""``python results/tools/dmg_tail_share.py``: the share of DMG's masked tail in one forward
pass, and the predict cost it implies.

DMG's ``predict`` runs the network below the first masked stage once and the masked tail once per
source domain, so its cost relative to ERM's predict should be about
``1 + (num_domains - 1) x share``, where ``share`` = time of the tail / time of the whole forward
(both in eval mode, no gradient). This script measures, alternating in one process (medians over
``--steps`` after ``--warmup``): the unmasked forward (ERM's predict: featurizer + classifier of
the same DMG network), the trunk (up to the first masked stage), the tail under one domain's soft
mask, DMG's ``predict`` and ERM's ``predict`` (a separate ERM with the same hparams), and prints
the share, the target and the measured ratio. Example (the benchmark of results/dmg_benchmarks.md)::

    python results/tools/dmg_tail_share.py --dataset Debug224 --batch_size 16 \
        --num_domains 3 --hparams '{"resnet18": true, "resnet50_augmix": false}'
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # benchmarks/


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="Debug224")
    p.add_argument("--data_dir", default=None)
    p.add_argument("--batch_size", type=int, default=16, help="images per predict call")
    p.add_argument("--num_domains", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--hparams", default=None, help="JSON overrides (DMG and ERM)")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)

    import torch

    import dg_plugins.algorithms  # noqa: F401  (registers)
    import dg_plugins.datasets  # noqa: F401
    from dg_plugins import hparams as hparams_lib
    from benchmarks.timing import alternating_medians
    from dg_plugins.registry import ALGORITHMS, DATASETS
    from dg_plugins.runtime import pick_device

    device = pick_device(args.device)
    torch.manual_seed(0)
    dataset = DATASETS.get(args.dataset)(args.data_dir, [], {})
    models = {}
    for name in ("ERM", "DMG"):
        hp = hparams_lib.default_hparams(name, args.dataset)
        changes = {"pretrained": False, **hparams_lib.parse_overrides(args.hparams)}
        hp.update(hparams_lib.validate(name, args.dataset, changes))
        models[name] = ALGORITHMS.get(name)(dataset.input_shape, dataset.num_classes,
                                            args.num_domains, hp).to(device).eval()
    dmg, erm = models["DMG"], models["ERM"]
    env = dataset[0]
    x = torch.stack([env[i % len(env)][0] for i in range(args.batch_size)]).to(device)
    probs = dmg.mask_probs()
    with torch.no_grad():
        h, start = dmg._trunk(x)
    one_mask = [p[:1] for p in probs]
    calls = {
        "full forward (unmasked)": lambda: dmg.classifier(dmg.featurizer(x)),
        "trunk (below the first mask)": lambda: dmg._trunk(x),
        "masked tail (one domain)": lambda: dmg._tail(h, start, one_mask),
        "DMG predict": lambda: dmg.predict(x),
        "ERM predict": lambda: erm.predict(x),
    }
    with torch.no_grad():  # alternating: load changes hit every row alike
        med = alternating_medians(calls, args.steps, args.warmup, device)
    share = med["masked tail (one domain)"] / med["full forward (unmasked)"]
    target = 1 + (args.num_domains - 1) * share
    ratio = med["DMG predict"] / med["ERM predict"]
    print(f"DMG masked-tail share: dataset {args.dataset} {tuple(dataset.input_shape)}, batch "
          f"{args.batch_size}, {args.num_domains} source domains, masked layers "
          f"{','.join(dmg.mask_layers)}, device {device}, {torch.get_num_threads()} threads, "
          f"median of {args.steps} after {args.warmup} warm-up, alternating")
    for key, value in med.items():
        print(f"  {key:<32} {1000 * value:9.1f} ms")
    print(f"  tail share {share:.3f}; target 1 + ({args.num_domains} - 1) x share = {target:.2f}; "
          f"measured DMG/ERM predict = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
