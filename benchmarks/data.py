"""A PACS-shaped JPEG tree for the benchmarks that run real jobs, made locally: four domains,
seven classes in DomainBed's layout at PACS's 227x227, each picture a class-coloured disc on a
domain-tinted background, so that decoding costs what it costs and a model can learn."""

from __future__ import annotations

import os
import random

from dg_plugins.catalog import IMAGE_FOLDER_DATASETS
from dg_plugins.layouts import DOMAIN_FOLDERS

PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")


def draw(rng: random.Random, class_index: int, domain_index: int, size: int):
    """One RGB picture of class ``class_index`` in domain ``domain_index``."""
    from PIL import Image, ImageDraw, ImageFilter

    hue = (37 * class_index) % 256
    background = tuple((60 * domain_index + rng.randrange(40)) % 256 for _ in range(3))
    image = Image.new("RGB", (size, size), background)
    pen = ImageDraw.Draw(image)
    radius = size // 4 + rng.randrange(max(1, size // 8))
    cx, cy = (size // 2 + rng.randrange(-(size // 8), size // 8 + 1) for _ in range(2))
    pen.ellipse([cx - radius, cy - radius, cx + radius, cy + radius],
                fill=(hue, 255 - hue, (hue * 3) % 256))
    if domain_index % 2:
        image = image.filter(ImageFilter.GaussianBlur(1))
    return image


def make_pacs_tree(data_dir: str, per_class: int = 20, size: int = 227, seed: int = 0) -> int:
    """Write ``per_class`` JPEGs per class and domain under ``data_dir/PACS``; the count."""
    rng = random.Random(seed)
    count = 0
    for d, domain in enumerate(DOMAIN_FOLDERS["PACS"]):
        for c, name in enumerate(PACS_CLASSES):
            folder = os.path.join(data_dir, IMAGE_FOLDER_DATASETS["PACS"], domain, name)
            os.makedirs(folder, exist_ok=True)
            for k in range(per_class):
                draw(rng, c, d, size).save(os.path.join(folder, f"{name}_{k:04d}.jpg"),
                                           quality=90)
                count += 1
    return count
