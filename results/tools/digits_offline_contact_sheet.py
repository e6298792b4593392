"""Contact sheet of the DigitsOffline benchmark: one band of rows per domain (in the dataset's
environment order), one column per class 0-9, the first ``--per_class`` images of each class in
the domain's stored order. Also prints the per-domain sizes, class counts and pixel statistics,
and the wall time of the build (0 when the arrays come from the cache).

    .venv/bin/python results/tools/digits_offline_contact_sheet.py \
        [--output results/digits_offline_contact_sheet.png] [--per_class 4] [--zoom 2] [--rebuild]

``--rebuild`` generates the arrays in this process without reading or writing the cache (to time
the generation).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from dg_plugins.datasets import digits_offline as D


def sheet(arrays: dict, per_class: int, zoom: int) -> Image.Image:
    tile, gap, label_w, band_gap = D.SIZE * zoom, 2, 92, 8
    n_rows = per_class * len(D.ENVIRONMENTS)
    width = label_w + 10 * (tile + gap)
    height = 22 + n_rows * (tile + gap) + band_gap * (len(D.ENVIRONMENTS) - 1)
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.truetype(D.font_paths()[0], 14)
    for c in range(10):
        draw.text((label_w + c * (tile + gap) + tile // 2 - 4, 3), str(c), fill=0, font=font)
    top = 22
    for domain in D.ENVIRONMENTS:
        x, y = arrays[f"x_{domain}"], arrays[f"y_{domain}"]
        draw.text((4, top + per_class * (tile + gap) // 2 - 8), domain, fill=0, font=font)
        for c in range(10):
            for r, i in enumerate(np.flatnonzero(y == c)[:per_class]):
                image = Image.fromarray(x[i]).resize((tile, tile), Image.NEAREST)
                canvas.paste(image, (label_w + c * (tile + gap), top + r * (tile + gap)))
        top += per_class * (tile + gap) + band_gap
    return canvas


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="results/digits_offline_contact_sheet.png")
    parser.add_argument("--per_class", type=int, default=4)
    parser.add_argument("--zoom", type=int, default=2)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    arrays = D.build_arrays() if args.rebuild else D.load_arrays()
    elapsed = time.perf_counter() - start
    print(f"arrays ready in {elapsed:.2f} s ({'generated' if args.rebuild else 'cache or build'})")
    print(f"{'domain':8} {'n':>5}  class counts                       mean   channel-std  "
          "colour-spread")
    for domain in D.ENVIRONMENTS:
        x = arrays[f"x_{domain}"].astype(np.float32) / 255.0
        counts = np.bincount(arrays[f"y_{domain}"], minlength=10)
        spread = x.std(axis=-1).mean()  # 0 for grey images
        print(f"{domain:8} {len(x):5d}  {' '.join(f'{v:3d}' for v in counts)}  {x.mean():.3f}  "
              f"{x.std(axis=(1, 2)).mean():.3f}        {spread:.3f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    sheet(arrays, args.per_class, args.zoom).save(args.output, optimize=True)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
