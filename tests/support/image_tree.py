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


#: The 42 files of the PACS sample that the project's tests were written against (40 images of
#: 227x227 RGB, JPEG except sketch's PNGs, and two stray shell scripts in the dataset folder),
#: by relative path; :func:`pacs_sample_dir` rebuilds it with synthetic pictures.
PACS_SAMPLE_FILES = """
art_painting/dog/pic_195.jpg art_painting/dog/pic_304.jpg art_painting/elephant/pic_026.jpg
art_painting/giraffe/pic_243.jpg art_painting/guitar/pic_020.jpg art_painting/guitar/pic_182.jpg
art_painting/horse/pic_142.jpg art_painting/person/pic_165.jpg art_painting/person/pic_199.jpg
art_painting/person/pic_497.jpg cartoon/dog/pic_112.jpg cartoon/dog/pic_137.jpg
cartoon/dog/pic_219.jpg cartoon/elephant/pic_332.jpg cartoon/giraffe/pic_377.jpg
cartoon/giraffe/pic_382.jpg cartoon/horse/pic_064.jpg cartoon/house/pic_040.jpg
cartoon/person/pic_111.jpg cartoon/person/pic_180.jpg photo/dog/n02103406_1011.jpg
photo/elephant/n02503517_6232.jpg photo/guitar/n02676566_7830.jpg photo/horse/105_0223.jpg
photo/house/pic_046.jpg photo/house/pic_110.jpg photo/house/pic_146.jpg photo/house/pic_218.jpg
photo/person/253_0221.jpg photo/person/253_0297.jpg sketch/dog/5302.png sketch/dog/5317.png
sketch/dog/n02103406_3255-6.png sketch/elephant/5981.png sketch/elephant/n02503517_12688-4.png
sketch/giraffe/n02439033_13384-2.png sketch/guitar/n02676566_8618-2.png
sketch/guitar/n03467517_6423-3.png sketch/horse/n02374451_779-1.png sketch/house/8873.png
""".split()
PACS_SAMPLE_SCRIPTS = ("main.sh", "run_with_bash_copy_files_according2txt.sh")


def make_pacs_sample(root, size: int = 227) -> Path:
    """Write the PACS sample's layout (:data:`PACS_SAMPLE_FILES`) under ``root/PACS``; returns
    ``root`` (the ``--data_dir``)."""
    root = Path(root)
    rng = random.Random(0)
    for relative in PACS_SAMPLE_FILES:
        domain, name, _ = relative.split("/")
        path = root / "PACS" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        draw_image(rng, PACS_CLASSES.index(name), PACS_DOMAINS.index(domain), size).save(path)
    for script in PACS_SAMPLE_SCRIPTS:
        (root / "PACS" / script).write_text("#!/bin/sh\n")
    return root


_SAMPLE: list[Path] = []


def pacs_sample_dir() -> Path:
    """The PACS sample, generated once per process in a temporary folder (read-only use: copy it
    before changing anything)."""
    if not _SAMPLE:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="dg_pacs_sample_"))
        atexit.register(shutil.rmtree, folder, True)
        _SAMPLE.append(make_pacs_sample(folder))
    return _SAMPLE[0]


def write_pacs_split_lists(root, every: int = 3, prefix: str = "") -> dict[str, dict[str, list]]:
    """Write PACS's official split lists for the PACS tree under ``root`` (``root/PACS``) in the
    official format, ``<domain>/<class>/<file> <label>`` with labels counting the seven PACS
    classes from 1: per domain, every ``every``-th image (in sorted path order) is in
    ``<domain>_crossval_kfold.txt``, the others in ``<domain>_train_kfold.txt``, and all of them in
    ``<domain>_test_kfold.txt`` (crossval lines first, so the test list's order differs from the
    images'). ``prefix`` is put before every path (e.g. "pacs_data/"). Returns ``{domain: {kind:
    [relative path, ...]}}`` as listed (without the prefix)."""
    root = Path(root) / "PACS"
    written = {}
    for domain in sorted(p.name for p in root.iterdir() if p.is_dir()):
        images = sorted(p.relative_to(root).as_posix() for p in (root / domain).rglob("*")
                        if p.is_file())
        crossval = images[::every]
        train = [p for p in images if p not in crossval]
        lists = {"train": train, "crossval": crossval, "test": crossval + train}
        for kind, paths in lists.items():
            lines = [f"{prefix}{p} {PACS_CLASSES.index(p.split('/')[1]) + 1}" for p in paths]
            (root / f"{domain}_{kind}_kfold.txt").write_text("\n".join(lines) + "\n")
        written[domain] = lists
    return written
