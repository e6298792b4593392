"""Helpers of the IP/OOP tests (importable from the test modules)."""

import hashlib

import numpy as np

TINY_MODEL = "dg-tiny-clip-test"
#: A tiny CLIP (builds in ~0.1 s): 224x224 inputs so that the dataset's own evaluation transform
#: (Resize 224) feeds it, patch 32 (49 tokens), 2 layers of width 64, text context 16.
TINY_CONFIG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 224, "layers": 2, "width": 64, "patch_size": 32,
                   "head_width": 32},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}


def fake_score(path: str) -> float:
    """A deterministic pseudo score in [0.05, 0.45) from the image's relative path."""
    digest = hashlib.md5(path.encode()).digest()
    return 0.05 + 0.4 * int.from_bytes(digest[:4], "little") / 2**32


def fake_table(dataset, data_dir, envs=None, model="ViT-B-16", pretrained="laion400m_e32"):
    """A precomputed score table (pseudo scores) for the environments of ``dataset``, with the
    data fingerprints the scorer records. Its header names the authors' model by default (the
    model the teterwak2025 rule is defined for), so that the rule's tests can use it."""
    from dg_plugins.alignment import ScoreTable, image_items
    from dg_plugins.alignment.provenance import FINGERPRINT_KEY, items_fingerprints

    items = image_items(dataset, range(len(dataset)) if envs is None else envs, data_dir)
    frame = items.drop(columns=["abs_path"])
    frame["score"] = np.asarray([fake_score(p) for p in frame["path"]], dtype=np.float32
                                ).astype(np.float64)
    return ScoreTable(frame, {"dataset": "PACS", "model": model, "pretrained": pretrained,
                              "prompt": "A photo of {}.", "transform": "none",
                              "data_dir": str(data_dir),
                              FINGERPRINT_KEY: items_fingerprints(items)})
