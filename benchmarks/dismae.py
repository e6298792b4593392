"""``python -m benchmarks dismae``: cost of a DisMAE (and MAE) *pretraining*
step (:meth:`pretrain_update`, no labels) relative to an ERM step of a ViT of the same width and
depth (ERM with ``backbone: vit`` and the same ``vit_arch``, random init) on the same images, and
the parameter counts of each part of the default model. Measured in one process, alternating the
algorithms step by step; median over ``--steps`` after ``--warmup``.

The generic ``python -m benchmarks`` times ``update`` (the DG variant, with its
CE head); this script times the UDG pretraining step, and prints the
parameter count of the pretraining model (semantic encoder, variation blocks, decoder, domain
classifier). DisMAE is timed on steps without and with the domain classifier's own pass (it
trains only on epochs 0-5 and every 15th epoch up to 100: about 2% of a 501-epoch schedule)::

    python -m benchmarks dismae --batch_size 2 --num_domains 3 --steps 3
"""

from __future__ import annotations

import argparse
import sys

from dg_plugins.help_text import plain_text


def parameter_counts(model) -> dict[str, int]:
    """Trainable parameters per top-level submodule, and their total."""
    import collections

    counts = collections.Counter()
    for name, p in model.named_parameters():
        if p.requires_grad:
            counts[name.split(".")[0]] += p.numel()
    return {**counts, "total": sum(counts.values())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks dismae",
        description=plain_text(__doc__.split("\n\n")[0]))
    p.add_argument("--arch", default="vit_base_patch16_224",
                   help="semantic encoder / ERM ViT architecture (timm name or preset)")
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=2, help="images per source domain")
    p.add_argument("--num_domains", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--dataset", default="DomainNet",
                   help="whose default hparams to use (e.g. DomainNet: decoder width 512, "
                   "6 variation blocks)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--algorithms", default="DisMAE,MAE")
    args = p.parse_args(argv)

    import torch

    from dg_plugins import hparams as hparams_lib
    from dg_plugins.algorithms.dismae import dcls_epoch_steps
    from dg_plugins.plugins import load
    from dg_plugins.registry import ALGORITHMS
    from benchmarks.timing import alternating_medians
    from dg_plugins.runtime import pick_device

    load()
    torch.manual_seed(0)
    shape = (args.channels, args.image_size, args.image_size)
    device = pick_device(args.device)
    models = {}
    for name in args.algorithms.split(","):
        hp = hparams_lib.default_hparams(name, args.dataset)
        hp["vit_arch"] = args.arch
        models[name] = ALGORITHMS.get(name)(shape, 20, args.num_domains, hp).to(device)
    erm_hp = hparams_lib.default_hparams("ERM", args.dataset)
    erm_hp.update(backbone="vit", vit_arch=args.arch, pretrained=False)
    erm = ALGORITHMS.get("ERM")(shape, 20, args.num_domains, erm_hp).to(device)

    images = [torch.randn(args.batch_size, *shape, device=device)
              for _ in range(args.num_domains)]
    labels = [torch.randint(0, 20, (args.batch_size,), device=device)
              for _ in range(args.num_domains)]
    batches = list(zip(images, labels))

    def pretrain(model, dcls: bool | None):
        if dcls is not None:  # place the step counter in an epoch where the classifier does (not)
            epoch_steps = max(1, dcls_epoch_steps(model.hparams, model.epoch_steps))
            model.step.fill_(0 if dcls else 7 * epoch_steps)
        model.pretrain_update(images)

    steps = {}
    for name, model in models.items():
        if hasattr(model, "domain_classifier"):
            # most steps: no domain-classifier pass (it trains on epochs 0-5 and every 15th only)
            steps[name] = lambda m=model: pretrain(m, False)
            steps[name + "+dcls"] = lambda m=model: pretrain(m, True)
        else:
            steps[name] = lambda m=model: pretrain(m, None)
    steps["ERM (ViT)"] = lambda: erm.update(batches)
    medians = alternating_medians(steps, args.steps, args.warmup, device)
    base = medians["ERM (ViT)"]
    print(f"Pretraining step vs ERM step of the same ViT ({args.arch}): {args.num_domains} "
          f"domains x {args.batch_size} images of {shape}, device {device}, median of "
          f"{args.steps} steps after {args.warmup} warm-up, alternating, one process")
    print(f"{'algorithm':<12} {'step s':>8} {'x ERM':>6}")
    for name, med in medians.items():
        print(f"{name:<12} {med:8.3f} {med / base:6.2f}")
    print("(DisMAE: a step without the domain-classifier pass, as on most epochs; DisMAE+dcls: a "
          "step of the epochs where the domain classifier trains, with its extra 15%-masked "
          "no-grad encoder pass)")
    print()
    for name, model in models.items():
        counts = parameter_counts(model)
        parts = ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in counts.items() if k != "total")
        print(f"{name} trainable parameters in pretraining: {counts['total'] / 1e6:.1f}M "
              f"({parts}; fine-tuning keeps the encoder)")
    print(f"ERM (ViT) trainable parameters: "
          f"{sum(p.numel() for p in erm.parameters() if p.requires_grad) / 1e6:.1f}M")
    return 0


if __name__ == "__main__":
    sys.exit(main())
