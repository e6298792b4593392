"""How recognisable MPBM's SGLD queries are for each SGLD noise scale (``mpbm_sgld_noise``), under a
trained model: the query diagnostics of dg_plugins/algorithms/mpbm.py (query-to-source
correlation, shares of query and source pixel values on the clamp bounds, the model's accuracy on
the queries), averaged over ``--images`` source (MNIST) images of DigitsOffline drawn at random
(``--seed``), in batches of 32.
The model is a job's ``model.pkl`` whose featurizer and classifier MPBM loads (an ERM or MPBM job
on DigitsOffline); the SGLD settings are MPBM's (``mpbm_eta``, ``mpbm_T``, ``mpbm_clamp`` from the
job's hparams, MPBM's defaults where the job has none). The rule the study used to pick the
phased_noise configuration (results/digits_offline.md): the largest scale whose mean query
correlation is at least ``--min_corr``.

    python results/tools/mpbm_query_noise.py MODEL_PKL [--scales 1 0.3 0.1] [--images 512]
"""

from __future__ import annotations

import argparse
import warnings

import dg_plugins.compat  # noqa: F401  (before torchvision)
import torch

import dg_plugins.algorithms  # noqa: F401  (registers MPBM)
import dg_plugins.datasets  # noqa: F401  (registers DigitsOffline)
from dg_plugins import hparams as hparams_lib
from dg_plugins.algorithms.mpbm import MPBM
from dg_plugins.registry import DATASETS

SCALES = [1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01]


def load_model(path: str, dataset) -> MPBM:
    saved = torch.load(path, map_location="cpu", weights_only=False)
    hparams = hparams_lib.default_hparams("MPBM", "DigitsOffline")
    hparams.update({k: v for k, v in saved["model_hparams"].items() if k in hparams})
    hparams["mpbm_schedule"] = "online"  # no phase buffers needed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MPBM(dataset.input_shape, dataset.num_classes, 1, hparams)
    state = {k: v for k, v in saved["model_dict"].items()
             if k.split(".")[0] in ("featurizer", "classifier", "network")}
    missing = [k for k in model.network.state_dict() if f"network.{k}" not in state]
    if missing:
        raise ValueError(f"{path} holds no featurizer/classifier weights for {missing[:3]}")
    model.load_state_dict(state, strict=False)
    return model.eval()


def measure(model: MPBM, x_all, y_all, scale: float, batch: int, seed: int) -> dict:
    model.hparams["mpbm_sgld_noise"] = scale
    sums, count = {}, 0
    generator = torch.Generator().manual_seed(seed)
    for start in range(0, len(y_all), batch):
        x, y = x_all[start:start + batch], y_all[start:start + batch]
        x_query = model.sgld_queries(x, y, generator=generator)
        values = model.query_diagnostics(x, x_query, y, model.query_features(x_query))
        for key, value in values.items():
            sums[key] = sums.get(key, 0.0) + value * len(y)
        count += len(y)
    return {key: value / count for key, value in sums.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_pkl")
    p.add_argument("--scales", type=float, nargs="+", default=SCALES)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min_corr", type=float, default=0.9)
    args = p.parse_args(argv)
    dataset = DATASETS.get("DigitsOffline")("builtin", [1, 2, 3, 4], {})
    x_all, y_all = dataset[0].tensors
    index = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(args.seed))
    x_all, y_all = x_all[index[:args.images]], y_all[index[:args.images]]
    model = load_model(args.model_pkl, dataset)
    eta = model.hparams["mpbm_eta"]
    print(f"mpbm_eta {eta}, mpbm_T {model.hparams['mpbm_T']}, mpbm_clamp "
          f"{model.hparams['mpbm_clamp']}, {len(y_all)} source images\n")
    print("| mpbm_sgld_noise | noise std / pixel | query corr | query clamped | source clamped "
          "| query acc (%) |")
    print("|--:|--:|--:|--:|--:|--:|")
    picked = None
    for scale in args.scales:
        v = measure(model, x_all, y_all, scale, args.batch, args.seed)
        print(f"| {scale:g} | {scale * (2 * eta) ** 0.5:.3f} | {v['diag_query_corr']:.3f} | "
              f"{v['diag_query_clamped']:.3f} | {v['diag_source_clamped']:.3f} | "
              f"{100 * v['diag_query_acc']:.1f} |")
        if v["diag_query_corr"] >= args.min_corr and (picked is None or scale > picked):
            picked = scale
    print(f"\nlargest scale with query corr >= {args.min_corr}: "
          + ("none" if picked is None else f"{picked:g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
