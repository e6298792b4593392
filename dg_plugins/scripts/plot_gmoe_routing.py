"""``python -m dg_plugins.scripts.plot_gmoe_routing``: the first-choice expert of each image
patch, per MoE layer, for a few images per domain (GMoE's expert-selection analysis, Li et al.,
ICLR 2023), of a trained ``--model`` or a fresh one, as a PNG. Torch and matplotlib are imported
inside the functions (``--help`` imports neither)."""

from __future__ import annotations

import argparse
import sys
import textwrap


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dg_plugins.scripts.plot_gmoe_routing",
                                description="Per-patch expert choice of a GMoE model (PNG).")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--model", default=None, help="model.pkl of a GMoE train job")
    p.add_argument("--dataset", default=None, help="dataset (default: the job's)")
    p.add_argument("--data_dir", default=None, help="data root (default: the job's)")
    p.add_argument("--hparams", default=None,
                   help="JSON overrides for a freshly built model (no --model)")
    p.add_argument("--pretrained", action="store_true",
                   help="fresh model: load pretrained backbone weights (default: random init)")
    p.add_argument("--envs", type=int, nargs="+", default=None, help="default: every env")
    p.add_argument("--images", type=int, default=3, help="images per environment")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--title", default=None)
    return p


def load_model(args):
    """``(algorithm, dataset name, data_dir)`` from a model.pkl or built fresh."""
    import torch

    import dg_plugins.algorithms  # noqa: F401  (registers)
    from dg_plugins import hparams as H
    from dg_plugins.registry import ALGORITHMS, DATASETS

    if args.model:
        saved = torch.load(args.model, map_location="cpu", weights_only=False)
        job = saved.get("args") or {}
        job = job if isinstance(job, dict) else vars(job)
        hp = dict(saved["model_hparams"], pretrained=False)  # weights come from the state dict
        algorithm = ALGORITHMS.get(job.get("algorithm", "GMoE"))(
            saved["model_input_shape"], saved["model_num_classes"], saved["model_num_domains"], hp)
        algorithm.load_state_dict(saved["model_dict"])
        return algorithm, args.dataset or job.get("dataset"), \
            args.data_dir if args.data_dir is not None else job.get("data_dir", "")
    if not args.dataset:
        raise ValueError("give --model PATH/model.pkl, or --dataset (and --data_dir) to build a "
                         "fresh GMoE")
    hp = H.default_hparams("GMoE", args.dataset)
    hp["pretrained"] = bool(args.pretrained)
    hp.update(H.validate("GMoE", args.dataset, H.parse_overrides(args.hparams)))
    dataset = DATASETS.get(args.dataset)(args.data_dir or "", [], dict(hp, data_augmentation=False))
    torch.manual_seed(args.seed)
    algorithm = ALGORITHMS.get("GMoE")(dataset.input_shape, dataset.num_classes,
                                       len(dataset) - 1, hp)
    return algorithm, args.dataset, args.data_dir or ""


def routing_maps(algorithm, images):
    """``images [B, C, H, W]`` -> ``{block index: [B, gh, gw] first-choice expert per patch}``."""
    import torch

    layers = getattr(algorithm, "moe_layers", None)
    if not layers:
        raise ValueError(f"{type(algorithm).__name__} has no MoE layers (a GMoE model is needed)")
    vit = algorithm.network
    grid = tuple(vit.patch_embed.grid_size)
    prefix = int(vit.num_prefix_tokens)
    algorithm.eval()
    for layer in layers:
        layer.record_experts = True
    try:
        with torch.no_grad():
            vit(images)
        return {block: layer.pop_routing().top1[:, prefix:].reshape(len(images), *grid).cpu()
                for block, layer in zip(algorithm.moe_blocks, layers)}
    finally:
        for layer in layers:
            layer.record_experts = False


def sample_images(dataset, envs, per_env, seed):
    """The first ``per_env`` images of each env after a seeded shuffle: ``(x, env of each)``."""
    import torch

    xs, owners = [], []
    generator = torch.Generator().manual_seed(seed)
    for env in envs:
        data = dataset[env]
        order = torch.randperm(len(data), generator=generator)[:per_env]
        xs += [data[int(i)][0] for i in order]
        owners += [env] * len(order)
    return torch.stack(xs), owners


def plot_routing(images, owners, env_names, maps, num_experts, out, title=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    colors = plt.get_cmap("tab10" if num_experts <= 10 else "tab20").colors[:num_experts]
    cmap = ListedColormap(colors)
    blocks = sorted(maps)
    rows, cols = len(images), 1 + len(blocks)
    fig, axes = plt.subplots(rows, cols, figsize=(2.0 * cols, 2.0 * rows), squeeze=False)
    for r, (img, env) in enumerate(zip(images, owners)):
        pic = img.float()
        pic = (pic - pic.min()) / (pic.max() - pic.min() + 1e-8)
        pic = (pic[0] if pic.shape[0] == 1 else pic[:3].permute(1, 2, 0)).numpy()
        height, width = pic.shape[:2]
        for ax in axes[r]:
            ax.imshow(pic, cmap="gray" if pic.ndim == 2 else None)
            ax.set(xticks=[], yticks=[])
        axes[r][0].set_ylabel(f"domain {env_names[env]}", fontsize=8)
        for block, ax in zip(blocks, axes[r][1:]):
            ax.imshow(maps[block][r].numpy(), cmap=cmap, vmin=-0.5, vmax=num_experts - 0.5,
                      alpha=0.55, interpolation="nearest",
                      extent=(-0.5, width - 0.5, height - 0.5, -0.5))
            if r == 0:
                ax.set_title(f"block {block}", fontsize=9)
    axes[0][0].set_title("image", fontsize=9)
    fig.legend(handles=[Patch(color=colors[e], label=f"expert {e}") for e in range(num_experts)],
               loc="lower center", ncol=min(num_experts, 6), fontsize=8, frameon=False)
    fig.suptitle(textwrap.fill(title or "GMoE: first-choice expert per patch", 18 * cols),
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import dg_plugins.datasets  # noqa: F401
        from dg_plugins import catalog
        from dg_plugins.registry import DATASETS

        algorithm, dataset_name, data_dir = load_model(args)
        if not dataset_name:
            raise ValueError("the model.pkl names no dataset; give --dataset")
        dataset = DATASETS.get(dataset_name)(data_dir, [],
                                             dict(algorithm.hparams, data_augmentation=False))
        envs = args.envs if args.envs is not None else list(range(len(dataset)))
        if bad := [e for e in envs if not 0 <= e < len(dataset)]:
            raise ValueError(f"--envs {bad} out of range: {dataset_name} has {len(dataset)} "
                             "environments")
        names = list(getattr(dataset, "ENVIRONMENTS", None)
                     or catalog.DATASET_ENVIRONMENTS.get(dataset_name)
                     or [str(i) for i in range(len(dataset))])
        images, owners = sample_images(dataset, envs, args.images, args.seed)
        plot_routing(images, owners, names, routing_maps(algorithm, images),
                     algorithm.moe_layers[0].num_experts, args.out, args.title)
    except (ValueError, KeyError, FileNotFoundError) as err:
        print(f"plot_gmoe_routing: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
