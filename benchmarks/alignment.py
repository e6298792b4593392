"""``python -m benchmarks alignment``: throughput of the AlignmentScore scorer
against open_clip's raw image-encoder forward, and the speed of a cached rerun.

    python -m benchmarks alignment [--model ViT-B-16 | --model_config JSON] \
        [--pretrained none] [--batch_size 32] [--batches 4] [--repeats 3] [--device cpu] \
        [--dataset PACS --data_dir DIR]

Three measurements, in one process, on the same model (random weights by default: speed does not
depend on the weights):

1. **Same pre-decoded batches** (decoding excluded): ``--batches`` batches of ``--batch_size``
   images (the dataset's images through its evaluation transform, cycled; random tensors without
   ``--data_dir``), on the host as a loader would hand them over. *raw*: ``model.encode_image(x)``
   per batch (inference mode, input moved to the device); *scorer*:
   :meth:`AlignmentScorer.score_batches` on the same batches (device copies, encoder,
   normalisation, the true class's text embedding, dot product, the copy of the scores back).
   Raw and scorer alternate ``--repeats`` times; images/s from the median round; the target is
   scorer / raw >= 0.9.
2. **End to end with decoding** (``--data_dir`` only): :func:`score_dataset` on the dataset's
   images with the cache off (files decoded in ``--num_workers`` loader workers), against the raw
   forward on the same, pre-decoded images.
3. **Cached rerun**: :func:`score_dataset` with a fresh cache (computes and stores every score,
   model load included), then again (reads them all); the rerun's speed-up is reported against the
   first run's scoring loop alone (conservative) and against its whole wall time. Target >= 100x.

Run it on a quiet machine; on a shared one run it twice and say so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks alignment",
                                description="AlignmentScore scorer throughput vs raw open_clip.")
    p.add_argument("--model", default="ViT-B-16")
    p.add_argument("--model_config", default=None, help="register an open_clip config (JSON)")
    p.add_argument("--pretrained", default="none")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1, help="warm-up batches (not timed)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default=None)
    p.add_argument("--dataset", default="PACS")
    p.add_argument("--data_dir", default=None)
    p.add_argument("--num_workers", type=int, default=None)
    p.add_argument("--skip_end_to_end", action="store_true")
    return p


def _timed(fn, device):
    from benchmarks.timing import synchronize

    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from dg_plugins.alignment import scoring
    from dg_plugins.datasets.image_folder import load_rgb_image
    from dg_plugins.runtime import pick_device

    device = pick_device(args.device)
    model_name = scoring.add_model_config(args.model_config) if args.model_config else args.model
    clip, preprocess, tokenizer = scoring.load_clip(model_name, args.pretrained, device)
    dataset = None
    if args.data_dir:
        from dg_plugins.plugins import build_dataset

        dataset = build_dataset(args.dataset, args.data_dir, {"data_augmentation": False})
    classes = list(dataset.classes) if dataset is not None else [f"class{i}" for i in range(7)]
    scorer = scoring.AlignmentScorer(clip, tokenizer, classes, device=device)
    size = scorer.image_size or (224, 224)
    n = args.batch_size * (args.batches + args.warmup)
    generator = torch.Generator().manual_seed(0)
    if dataset is not None:
        files = [p for env in dataset.datasets for p, _ in env.samples]
        images = torch.stack([dataset.plain_transform(load_rgb_image(files[i % len(files)]))
                              for i in range(n)])
    else:
        images = torch.randn(n, 3, *size, generator=generator)
    labels = torch.randint(len(classes), (n,), generator=generator)
    batches = [(images[k:k + args.batch_size], labels[k:k + args.batch_size])
               for k in range(0, n, args.batch_size)]
    warm, timed = batches[:args.warmup], batches[args.warmup:]
    n_timed = sum(len(x) for x, _ in timed)

    def raw(batch_list):
        with torch.inference_mode():
            for x, _ in batch_list:
                clip.encode_image(x.to(device, non_blocking=True))

    raw(warm)
    scorer.score_batches(warm)
    rounds = {"raw": [], "scorer": []}
    for _ in range(args.repeats):
        rounds["raw"].append(_timed(lambda: raw(timed), device))
        rounds["scorer"].append(_timed(lambda: scorer.score_batches(timed), device))
    ips = {k: n_timed / statistics.median(v) for k, v in rounds.items()}
    print(f"device {device}, model {model_name} (pretrained={args.pretrained}), batch "
          f"{args.batch_size}, {args.batches} timed batches x {args.repeats} rounds, torch "
          f"threads {torch.get_num_threads()}")
    print("1. same pre-decoded batches (decoding excluded)")
    print(f"   raw encode_image     {ips['raw']:9.2f} images/s   rounds (s): "
          + ", ".join(f"{t:.2f}" for t in rounds["raw"]))
    print(f"   scorer score_batches {ips['scorer']:9.2f} images/s   rounds (s): "
          + ", ".join(f"{t:.2f}" for t in rounds["scorer"]))
    print(f"   ratio scorer / raw   {ips['scorer'] / ips['raw']:9.3f}   (target >= 0.9)")

    if dataset is not None and not args.skip_end_to_end:
        envs = list(range(len(dataset)))
        files = [p for env in dataset.datasets for p, _ in env.samples]
        decoded = torch.stack([dataset.plain_transform(load_rgb_image(p)) for p in files])
        same = [(decoded[k:k + args.batch_size], None)
                for k in range(0, len(decoded), args.batch_size)]
        t_raw = _timed(lambda: raw(same), device)
        run = scoring.score_dataset(dataset, envs, args.data_dir, model=model_name,
                                    pretrained=args.pretrained, batch_size=args.batch_size,
                                    device=device,
                                    num_workers=args.num_workers, use_cache=False,
                                    loaded=(clip, preprocess, tokenizer))
        print(f"2. end to end with decoding ({len(files)} images of {args.dataset}, loader "
              f"workers {args.num_workers if args.num_workers is not None else 'default'})")
        print(f"   raw encode_image (pre-decoded) {len(files) / t_raw:9.2f} images/s")
        print(f"   score_dataset (decoding)       {len(files) / run.scoring_seconds:9.2f} "
              f"images/s   ratio {t_raw / run.scoring_seconds:.3f}")

        with tempfile.TemporaryDirectory() as cache_dir:
            first = scoring.score_dataset(dataset, envs, args.data_dir, model=model_name,
                                          pretrained=args.pretrained, batch_size=args.batch_size,
                                          device=device, num_workers=args.num_workers,
                                          cache_dir=cache_dir)
            rerun = [scoring.score_dataset(dataset, envs, args.data_dir, model=model_name,
                                           pretrained=args.pretrained, cache_dir=cache_dir)
                     for _ in range(max(3, args.repeats))]
            assert all(r.n_computed == 0 for r in rerun)
            t_cached = statistics.median(r.seconds for r in rerun)
        print(f"3. cached rerun ({len(files)} images)")
        print(f"   first run: {first.seconds:.2f} s wall ({first.scoring_seconds:.2f} s scoring "
              f"loop, {len(files) / first.scoring_seconds:.2f} images/s)")
        print(f"   cached rerun: {t_cached * 1000:.1f} ms ({len(files) / t_cached:.0f} images/s)"
              f"; speed-up {first.scoring_seconds / t_cached:.0f}x vs the scoring loop, "
              f"{first.seconds / t_cached:.0f}x vs the first run (target >= 100x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
