"""Tiny data folders shaped like the real releases the paper scripts read, written at test time
(``--data_dir`` layouts of DomainBed's ``domainbed/scripts/download.py`` and the package's
downloader, ``dg_plugins/datasets/download``):

* :func:`pacs`: the shared 42-file PACS sample (:func:`image_tree.make_pacs_sample`: 40 images,
  each domain lacking one class, sketch in PNG, two stray scripts) with PACS's twelve official
  split lists, whose ``<domain>_test_kfold.txt`` holds every image of the domain
  (:func:`image_tree.write_pacs_split_lists`);
* :func:`domain_net`: ``domain_net/<domain>/<class>/<domain>_<class index>_<n>.jpg`` after
  DomainBed's download: the files its ``domain_net_duplicates.txt`` names are gone, and
  DomainNet's own ``<domain>_train.txt`` / ``<domain>_test.txt`` lists (lines ``<domain>/<class>/
  <file> <label>``, without the duplicates) lie beside the domain folders, as the DomainNet site
  publishes them for the DMG release;
* :func:`terra_incognita`: ``terra_incognita/location_<id>/<category>/<uuid>.jpg`` for locations
  100, 38, 43, 46 (the downloader's layout), each location with some of the ten categories;
* :func:`digits`: ``digits/<domain>/`` in each domain's released format (MNIST IDX, SVHN and SYN
  ``.mat``, MNIST-M PNGs and label list, USPS ``zip.test.gz``), :mod:`dg_plugins.datasets.digits`.
"""

from __future__ import annotations

import gzip
import random
import struct
from pathlib import Path

import numpy as np

from support.image_tree import draw_image, make_pacs_sample, write_pacs_split_lists

DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
TERRA_LAYOUT = {  # location -> its categories (the ten categories, each in two locations)
    "location_100": ("bird", "bobcat", "cat", "coyote", "dog"),
    "location_38": ("empty", "opossum", "rabbit", "raccoon", "squirrel"),
    "location_43": ("bird", "cat", "dog", "empty", "rabbit"),
    "location_46": ("bobcat", "coyote", "opossum", "raccoon", "squirrel"),
}


def pacs(root, size: int = 227) -> Path:
    """The PACS sample and its official split lists under ``root`` (the ``--data_dir``)."""
    make_pacs_sample(root, size=size)
    write_pacs_split_lists(root)
    return Path(root)


def domain_net(root, classes, per_class: int, size: int = 32,
               duplicates: int = 1) -> dict[str, list[str]]:
    """DomainNet's layout under ``root/domain_net`` with ``classes`` (DomainNet folder names),
    ``per_class`` images per class and domain, then the first image of the first ``duplicates``
    classes of clipart and sketch removed as DomainBed removes its listed duplicates. Returns the
    kept images per domain (``<domain>/<class>/<file>``)."""
    base = Path(root) / "domain_net"
    rng = random.Random(0)
    names = sorted(classes)
    kept = {}
    for d, domain in enumerate(DOMAINNET_DOMAINS):
        kept[domain] = []
        for c, name in enumerate(names):
            folder = base / domain / name
            folder.mkdir(parents=True)
            for k in range(per_class):
                path = folder / f"{domain}_{c:03d}_{k + 1:06d}.jpg"
                draw_image(rng, c, d, size).save(path, quality=90)
                kept[domain].append(path.relative_to(base).as_posix())
    listed = [f"{domain}/{names[c]}/{domain}_{c:03d}_000001.jpg" for domain in ("clipart", "sketch")
              for c in range(duplicates)]
    for relative in listed:  # DomainBed: os.remove for each line of domain_net_duplicates.txt
        (base / relative).unlink()
        kept[relative.split("/")[0]].remove(relative)
    for domain, paths in kept.items():
        test = paths[::3]
        parts = {"train": [p for p in paths if p not in test], "test": test}
        for part, chosen in parts.items():
            lines = [f"{p} {names.index(p.split('/')[1])}\n" for p in chosen]
            (base / f"{domain}_{part}.txt").write_text("".join(lines))
    return kept


def terra_incognita(root, per_category: int = 1, size: int = 48) -> dict[str, int]:
    """TerraIncognita's layout under ``root/terra_incognita`` (:data:`TERRA_LAYOUT`); returns the
    images per location."""
    base = Path(root) / "terra_incognita"
    rng = random.Random(1)
    all_categories = sorted({c for cats in TERRA_LAYOUT.values() for c in cats})
    counts = {}
    for d, (location, categories) in enumerate(sorted(TERRA_LAYOUT.items())):
        counts[location] = 0
        for category in categories:
            folder = base / location / category
            folder.mkdir(parents=True)
            for k in range(per_category):
                name = f"{rng.getrandbits(32):08x}-23d2-11e8-a6a3-ec086b02610b.jpg"
                draw_image(rng, all_categories.index(category), d, size).save(folder / name)
                counts[location] += 1
    return counts


def _idx_gz(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def digits(root, n_source: int = 20, n_target: int = 10) -> Path:
    """Each Digits domain in its released format under ``root/digits``."""
    from PIL import Image
    from scipy.io import savemat

    rng = np.random.RandomState(0)
    base = Path(root) / "digits"
    (base / "mnist").mkdir(parents=True)
    _idx_gz(base / "mnist" / "train-images-idx3-ubyte.gz", rng.randint(0, 256, (n_source, 28, 28)))
    _idx_gz(base / "mnist" / "train-labels-idx1-ubyte.gz", np.arange(n_source) % 10)
    labels = np.arange(n_target) % 10
    for domain, name in (("svhn", "test_32x32.mat"), ("syn", "synth_test_32x32.mat")):
        (base / domain).mkdir()
        images = rng.randint(0, 256, (32, 32, 3, n_target)).astype(np.uint8)
        savemat(base / domain / name, {"X": images,
                                       "y": np.where(labels == 0, 10, labels).reshape(-1, 1)})
    folder = base / "mnist_m" / "mnist_m_test"
    folder.mkdir(parents=True)
    lines = []
    for i, label in enumerate(labels):
        Image.fromarray(rng.randint(0, 256, (32, 32, 3)).astype(np.uint8)).save(
            folder / f"{i:08d}.png")
        lines.append(f"{i:08d}.png {label}")
    (base / "mnist_m" / "mnist_m_test_labels.txt").write_text("\n".join(lines) + "\n")
    (base / "usps").mkdir()
    rows = [" ".join([f"{label:.4f}"] + [f"{v:.6f}" for v in rng.uniform(-1, 1, 256)])
            for label in labels]
    with gzip.open(base / "usps" / "zip.test.gz", "wt") as handle:
        handle.write("\n".join(rows) + "\n")
    return Path(root)


def clip_checkpoint(path, class_scores: dict[str, float], prompt: str = "A photo of {}.",
                    model: str = "ViT-B-16") -> Path:
    """Write an open_clip ``model`` checkpoint whose AlignmentScore (image-text cosine, see
    :mod:`dg_plugins.alignment.scoring`) of any image with the class name ``c`` under ``prompt``
    is ``class_scores[c]``, so that a test knows which images are IP, OOP or dropped.

    How: every residual branch of both towers is zero, so the image feature is
    ``ln_post(.) @ proj`` with ``ln_post`` a constant (weight 0): the unit vector ``u``; the text
    tower's first block attends uniformly (zero queries and keys) with identity values, so the
    end-of-text token gets the mean of the layer-normed token embeddings, all zero but those of
    the class-name tokens, set to ``cos(t) u + sin(t) v`` (``v`` orthogonal to ``u``, both
    zero-mean so that layer norms keep their direction) with ``cos(t)`` the class's score. Zero
    tensors are saved as expanded scalars, so the file holds little more than the token
    embeddings (float16)."""
    import torch

    import dg_plugins.compat  # noqa: F401  (before open_clip)
    import open_clip

    clip = open_clip.create_model(model)
    tokenizer = open_clip.get_tokenizer(model)
    state = clip.state_dict()
    width = clip.token_embedding.weight.shape[1]
    u, v = torch.zeros(width), torch.zeros(width)
    u[0], u[1], v[2], v[3] = 2 ** -0.5, -(2 ** -0.5), 2 ** -0.5, -(2 ** -0.5)

    def constant(value, shape):
        return torch.full((), value, dtype=torch.float16).expand(shape)

    out = {name: constant(0, tensor.shape) for name, tensor in state.items()}
    for name in state:  # layer norms: weight 1, bias 0
        if (".ln_" in name or name.startswith(("ln_", "visual.ln_"))) and name.endswith("weight"):
            out[name] = constant(1, state[name].shape)
    embed_dim = clip.visual.proj.shape[1]
    proj = torch.zeros(clip.visual.proj.shape, dtype=torch.float16)
    proj[0] = u[:embed_dim]
    out["visual.proj"] = proj
    out["visual.ln_post.weight"] = constant(0, state["visual.ln_post.weight"].shape)
    bias = torch.zeros(state["visual.ln_post.bias"].shape, dtype=torch.float16)
    bias[0] = 1
    out["visual.ln_post.bias"] = bias
    eye = torch.eye(width, dtype=torch.float16)
    in_proj = torch.zeros(3 * width, width, dtype=torch.float16)
    in_proj[2 * width:] = eye
    out["transformer.resblocks.0.attn.in_proj_weight"] = in_proj
    out["transformer.resblocks.0.attn.out_proj.weight"] = eye.clone()
    out["text_projection"] = torch.eye(*state["text_projection"].shape, dtype=torch.float16)
    tokens = torch.zeros(state["token_embedding.weight"].shape, dtype=torch.float16)
    special = set(tokenizer([prompt.format("")])[0].tolist())
    for name, score in class_scores.items():
        ids = [i for i in tokenizer([prompt.format(name)])[0].tolist() if i not in special]
        angle = float(np.arccos(score))
        for i in ids:
            tokens[i] = (np.cos(angle) * u + np.sin(angle) * v).half()
    out["token_embedding.weight"] = tokens
    out["logit_scale"] = state["logit_scale"].half()
    torch.save(out, path)
    return Path(path)
