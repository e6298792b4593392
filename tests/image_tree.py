"""Small image-folder trees made with PIL, in DomainBed's layout
(``<root>/<dataset folder>/<domain>/<class>/<image>``), so that image-dataset tests run on a
fresh clone.

:func:`make_pacs_tree` mirrors PACS: its four domains and seven classes, each domain lacking one
class. Each image is a class-coloured disc on a domain-styled background (JPEG), so the classes
are learnable and the domains differ.
"""

from __future__ import annotations

import random
from pathlib import Path

PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
#: The class each PACS domain lacks (as in the shared 42-image PACS sample).
PACS_MISSING = {"art_painting": "house", "cartoon": "guitar", "photo": "giraffe",
                "sketch": "person"}


def draw_image(rng: random.Random, class_index: int, domain_index: int, size: int):
    from PIL import Image, ImageDraw, ImageFilter

    hue = (37 * class_index) % 256
    background = tuple((60 * domain_index + rng.randrange(40)) % 256 for _ in range(3))
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    radius = size // 4 + rng.randrange(size // 8)
    cx, cy = (size // 2 + rng.randrange(-size // 8, size // 8 + 1) for _ in range(2))
    draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius],
                 fill=(hue, 255 - hue, (hue * 3) % 256))
    if domain_index % 2:
        image = image.filter(ImageFilter.GaussianBlur(1))
    return image


def make_pacs_tree(root, per_class: int = 3, size: int = 48, seed: int = 0) -> Path:
    """Write a PACS-layout tree under ``root`` (``root/PACS/...``); returns ``root`` (the
    ``--data_dir``)."""
    root = Path(root)
    rng = random.Random(seed)
    for d, domain in enumerate(PACS_DOMAINS):
        for c, name in enumerate(PACS_CLASSES):
            if PACS_MISSING[domain] == name:
                continue
            folder = root / "PACS" / domain / name
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(per_class):
                draw_image(rng, c, d, size).save(folder / f"{name}_{k}.jpg", quality=90)
    return root


def truncate_image(path) -> None:
    """Cut a JPEG to half its bytes, so that decoding it fails."""
    path = Path(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
