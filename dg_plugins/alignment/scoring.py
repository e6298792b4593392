"""AlignmentScore of every image of a dataset's environments with open_clip (Teterwak et al.,
ICLR 2025, Eq. 1: the raw cosine of the image and its true class's prompt), as the authors'
scorer computes it; weights offline-safe. Defaults and deviations: docs/methods/alignment.md."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

import dg_plugins.compat  # noqa: F401  (must precede torchvision / open_clip imports)
from dg_plugins.alignment.provenance import (DEFAULT_MODEL, DEFAULT_PRETRAINED,
                                             DEFAULT_PROMPT, FINGERPRINT_KEY, table_fingerprints)
from dg_plugins.alignment.scores_file import ScoreCache, ScoreTable, default_cache_dir, image_key
from dg_plugins.alignment.wrapper import image_items
from dg_plugins.files import atomic_write_text
from dg_plugins.networks.pretrained import (PretrainedWeightsUnavailable, check_hub_available,
                                            hub_offline, require_cached_or_reachable)

RANDOM_INIT = ("none", "random", "")
TRANSFORMS = ("dataset", "clip")
#: open_clip's default weight file names on the hub (``open_clip/constants.py``).
HF_WEIGHTS_NAME = "open_clip_pytorch_model.bin"
HF_SAFE_WEIGHTS_NAME = "open_clip_model.safetensors"
HF_CONFIG_NAME = "open_clip_config.json"


def is_random_init(pretrained) -> bool:
    return pretrained is None or str(pretrained).lower() in RANDOM_INIT


def add_model_config(path: str) -> str:
    """Register an open_clip model config file under its file name stem; returns that name."""
    import open_clip

    if not os.path.isfile(path):
        raise FileNotFoundError(f"model config {path!r} does not exist")
    with open(path) as f:
        cfg = json.load(f)
    if missing := [k for k in ("embed_dim", "vision_cfg", "text_cfg") if k not in cfg]:
        raise ValueError(f"model config {path!r} lacks {missing} (an open_clip model config has "
                         "embed_dim, vision_cfg and text_cfg)")
    open_clip.add_model_config(path)
    return os.path.splitext(os.path.basename(path))[0]


def model_config(model_name: str) -> dict:
    """The open_clip architecture config of ``model_name`` (raises with the valid names)."""
    import open_clip

    if model_name.startswith(("hf-hub:", "local-dir:")):
        return {"source": model_name}
    cfg = open_clip.get_model_config(model_name)
    if cfg is None:
        raise ValueError(f"unknown open_clip model {model_name!r}; choose one of "
                         f"open_clip.list_models() (e.g. ViT-B-16, ViT-B-32, ViT-L-14, RN50), "
                         "or register a config file with --model_config")
    return cfg


def _unavailable(what: str, where: str, reason: str) -> PretrainedWeightsUnavailable:
    return PretrainedWeightsUnavailable(
        f"CLIP weights for {what} are not cached and cannot be downloaded ({reason}). Fixes: "
        "download the checkpoint elsewhere and pass the file with --pretrained "
        "/path/to/open_clip_pytorch_model.bin --pretrained_tag TAG (for ViT-B-16 laion400m_e32: "
        "open_clip_pytorch_model.bin of huggingface.co/timm/vit_base_patch16_clip_224."
        "laion400m_e32, then --pretrained_tag laion400m_e32); or run once with network access to "
        f"fill the cache ({where}); or, for a smoke test only, --pretrained none (random weights: "
        "the scores mean nothing).")


def hub_weight_files(filename: str) -> list[str]:
    """The files open_clip tries, in order, for a hub weight file (``download_pretrained_from_hf``
    in ``open_clip/pretrained.py``: the safetensors alternative first)."""
    if filename.endswith((".bin", ".pth")):  # HF_WEIGHTS_NAME among them
        safe = filename[:-4] + ".safetensors"
        return [HF_SAFE_WEIGHTS_NAME if filename == HF_WEIGHTS_NAME else safe, filename]
    return [filename]


def clip_url_cache() -> str:
    """The folder of weights open_clip downloads from a URL, read at each call."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME")
                        or os.path.join(os.path.expanduser("~"), ".cache"), "clip")


def check_weights_available(model_name: str, pretrained) -> bool:
    """Fail fast, with the fixes, on weights not local, cached or downloadable; True: hub cache."""
    import open_clip

    if model_name.startswith("hf-hub:"):
        return check_hub_available(model_name[len("hf-hub:"):], model_name,
                                   [[HF_CONFIG_NAME], hub_weight_files(HF_WEIGHTS_NAME)],
                                   _unavailable)
    if is_random_init(pretrained) or os.path.isfile(str(pretrained)):
        return False
    cfg = open_clip.get_pretrained_cfg(model_name, pretrained)
    if not cfg:
        if os.sep in str(pretrained) or str(pretrained).endswith((".pt", ".pth", ".bin",
                                                                  ".safetensors")):
            raise FileNotFoundError(f"--pretrained {pretrained!r}: no such checkpoint file")
        tags = open_clip.list_pretrained_tags_by_model(model_name)
        raise ValueError(f"--pretrained {pretrained!r} is neither a checkpoint file nor a "
                         f"pretrained tag of {model_name}; its tags: {', '.join(tags) or 'none'} "
                         "(or 'none' for random weights)")
    if cfg.get("file"):
        return False
    what = f"{model_name} {pretrained}"
    if cfg.get("hf_hub"):  # open_clip prefers the hub when an entry has both (download_pretrained)
        repo_id, filename = os.path.split(cfg["hf_hub"])
        return check_hub_available(repo_id, what, [hub_weight_files(filename or HF_WEIGHTS_NAME)],
                                   _unavailable)
    if cfg.get("url"):
        require_cached_or_reachable(what, os.path.join(clip_url_cache(),
                                                       os.path.basename(cfg["url"])),
                                    cfg["url"], _unavailable)
    return False


MEMO_NAME = "checkpoint_sha256.json"
_SAMPLE = 1 << 16


def file_sha256(path: str, memo_dir: str | None = None) -> str:
    """sha256 of a file's content, memoised in ``memo_dir`` under the file's identity: what must
    be unchanged to reuse a memoised hash (path, inode, size, times, sampled bytes)."""
    path = os.path.abspath(path)
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for k in range(5):
            f.seek(max(0, min(st.st_size - _SAMPLE, k * st.st_size // 4)))
            h.update(f.read(_SAMPLE))
    memo_key = "\t".join(map(str, (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                   st.st_ctime_ns, h.hexdigest())))
    memo_path = os.path.join(memo_dir, MEMO_NAME) if memo_dir else None
    memo = {}
    if memo_path and os.path.exists(memo_path):
        with contextlib.suppress(OSError, ValueError), open(memo_path) as f:
            memo = json.load(f)
        memo = memo if isinstance(memo, dict) else {}
        if isinstance(memo.get(memo_key), str):
            return memo[memo_key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    digest = h.hexdigest()
    if memo_path:
        with contextlib.suppress(OSError):  # atomic_write_text makes the folder
            prefix = path + "\t"  # older entries of this path are stale: drop them
            memo = {k: v for k, v in memo.items() if not k.startswith(prefix)}
            memo[memo_key] = digest
            atomic_write_text(memo_path, json.dumps(memo))
    return digest


def load_clip(model_name: str = DEFAULT_MODEL, pretrained=DEFAULT_PRETRAINED, device="cpu",
              seed: int = 0):
    """``(model, preprocess_val, tokenizer)`` from open_clip, in eval mode on ``device``.
    ``pretrained``: a tag, a checkpoint file, or ``none`` (random init, seeded by ``seed``)."""
    import open_clip
    import torch

    model_config(model_name)
    from_cache = check_weights_available(model_name, pretrained)
    random_init = is_random_init(pretrained)
    cfg = {} if model_name.startswith("hf-hub:") or random_init or os.path.isfile(
        str(pretrained)) else open_clip.get_pretrained_cfg(model_name, pretrained) or {}
    from_url = cfg.get("url") and not cfg.get("file") and not cfg.get("hf_hub")  # not the hub
    with torch.random.fork_rng(devices=[]), (hub_offline() if from_cache
                                             else contextlib.nullcontext()):
        torch.manual_seed(seed)
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(
                model_name, pretrained=None if random_init else str(pretrained),
                cache_dir=clip_url_cache() if from_url else None)
        except RuntimeError as err:
            raise PretrainedWeightsUnavailable(
                f"open_clip could not load {model_name} with pretrained={pretrained!r}: {err}"
            ) from err
    return model.eval().to(device), preprocess, open_clip.get_tokenizer(model_name)


def check_prompt(prompt: str) -> None:
    if prompt.count("{}") != 1:
        raise ValueError(f"--prompt {prompt!r} must contain exactly one '{{}}' (the class name "
                         "goes there), e.g. 'A photo of {}.'")


class AlignmentScorer:
    """Scores images ``[B, 3, H, W]`` against their classes' prompts: ``[B]`` raw cosines."""

    def __init__(self, model, tokenizer, class_names, prompt: str = DEFAULT_PROMPT,
                 device=None):
        import torch

        check_prompt(prompt)
        self.model = model
        self.device = torch.device(device) if device is not None else next(
            model.parameters()).device
        self.prompts = [prompt.replace("{}", name) for name in class_names]
        size = getattr(getattr(model, "visual", None), "image_size", None)
        self.image_size = (size, size) if isinstance(size, int) else size and tuple(size)
        with torch.inference_mode():
            text = model.encode_text(tokenizer(self.prompts).to(self.device))
            self.text_features = torch.nn.functional.normalize(text.float(), dim=-1)

    def score_batch(self, images, class_index):
        import torch

        with torch.inference_mode():
            if self.image_size is not None and tuple(images.shape[-2:]) != self.image_size:
                raise ValueError(
                    f"the model expects {self.image_size[0]}x{self.image_size[1]} images but the "
                    f"transform gives {images.shape[-2]}x{images.shape[-1]}; use the model's own "
                    "preprocessing (--transform clip) or a model made for this size")
            features = self.model.encode_image(images.to(self.device, non_blocking=True))
            features = torch.nn.functional.normalize(features.float(), dim=-1)
            text = self.text_features[class_index.to(self.device, non_blocking=True)]
            return (features * text).sum(dim=-1)


class _ImageFiles:
    """Torch dataset of ``(transform(RGB image), position)`` for a list of image files."""

    def __init__(self, paths, transform):
        self.paths = list(paths)
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        from dg_plugins.datasets.image_folder import load_rgb_image

        return self.transform(load_rgb_image(self.paths[index])), index


@dataclass
class ScoreRun:
    table: ScoreTable
    n_images: int = 0
    n_cached: int = 0
    n_computed: int = 0
    cache_status: str = "disabled"
    cache_path: str | None = None
    seconds: float = 0.0
    scoring_seconds: float = 0.0
    notes: list = field(default_factory=list)


def format_rate(n: int, seconds: float) -> str:
    """``"45.5 img/s"``, or ``"23.4 s/img"`` below one image per second; ``"-"`` for none."""
    if n <= 0 or not seconds > 0:
        return "-"
    rate = n / seconds
    return f"{rate:.1f} img/s" if rate >= 1 else f"{seconds / n:.1f} s/img"


class _PlainProgress:
    """A plain progress log (one line per ~10%) when stderr is not a terminal."""

    def __init__(self, total, desc):
        self.total, self.desc, self.done, self.next = total, desc, 0, 0.1
        self.start = time.perf_counter()

    def update(self, n):
        self.done += n
        if self.total and self.done / self.total >= self.next:
            print(f"{self.desc}: {self.done}/{self.total} images "
                  f"({format_rate(self.done, time.perf_counter() - self.start)})", file=sys.stderr)
            while self.done / self.total >= self.next:
                self.next += 0.1

    def close(self):
        pass


def score_dataset(dataset, envs=None, data_dir: str | None = None, *,
                  model: str = DEFAULT_MODEL, pretrained=DEFAULT_PRETRAINED,
                  prompt: str = DEFAULT_PROMPT, transform="dataset", batch_size: int = 64,
                  device=None, num_workers: int | None = None, cache_dir: str | None = None,
                  use_cache: bool = True, seed: int = 0, dataset_name: str | None = None,
                  loaded=None, pretrained_tag: str | None = None) -> ScoreRun:
    """AlignmentScore of every image of ``envs`` of ``dataset`` (cached ones read): a ScoreRun."""
    import open_clip
    import torch

    from dg_plugins.runtime import pick_device

    start = time.perf_counter()
    check_prompt(prompt)
    envs = list(range(len(dataset))) if envs is None else [int(e) for e in envs]
    if isinstance(transform, str) and transform not in TRANSFORMS:
        raise ValueError(f"transform {transform!r}: choose from {', '.join(TRANSFORMS)}")
    kind = transform if isinstance(transform, str) else "custom"
    items = image_items(dataset, envs, data_dir)  # first: rejects datasets without image files
    if pretrained_tag is not None and not os.path.isfile(str(pretrained)):
        raise ValueError(f"--pretrained_tag {pretrained_tag!r} declares the weights of a "
                         f"checkpoint file, but --pretrained {pretrained!r} is not a file (a tag "
                         "names itself: leave --pretrained_tag out)")
    stats = [os.stat(p) for p in items["abs_path"].tolist()]  # one stat per image, used twice
    image_transform = transform if kind == "custom" else None
    if kind == "dataset":  # its evaluation transform: plain_transform, else the first env's
        image_transform = getattr(dataset, "plain_transform", None)
        if image_transform is None and envs:
            image_transform = getattr(dataset[envs[0]], "transform", None)
        if image_transform is None:
            raise ValueError(f"{type(dataset).__name__} exposes no evaluation transform "
                             "(plain_transform, or a transform on its environments); use "
                             "--transform clip")
    random_init = is_random_init(pretrained)
    setting = {"model": model, "model_config": model_config(model), "prompt": prompt,
               "transform": "open_clip preprocess_val of the model and pretrained weights"
               if kind == "clip" else ("dataset-eval: " if kind == "dataset" else "custom: ")
               + " ".join(repr(image_transform).split())}
    sha = None
    if random_init:
        setting.update(pretrained="none", seed=int(seed))
    elif os.path.isfile(str(pretrained)):
        sha = file_sha256(str(pretrained), cache_dir or default_cache_dir())
        setting.update(pretrained="file", pretrained_sha256=sha)
    else:
        setting.update(pretrained=str(pretrained))

    n = len(items)
    scores, cache, keys = np.full(n, np.nan), None, None
    if use_cache and loaded is None:  # an injected model is not described by the setting
        cache = ScoreCache(setting, cache_dir)
        keys = [image_key(p, c, st) for p, c, st in zip(items["abs_path"].tolist(),
                                                         items["class"].tolist(), stats)]
        scores = cache.lookup(keys)
    todo = np.flatnonzero(np.isnan(scores))
    run = ScoreRun(table=None, n_images=n, n_cached=n - len(todo), n_computed=len(todo),
                   cache_status=cache.status if cache is not None else "disabled",
                   cache_path=cache.path if cache is not None else None)

    if len(todo):
        device = pick_device(device)
        clip_model, preprocess, tokenizer = loaded or load_clip(model, pretrained, device, seed)
        if kind == "clip":
            image_transform = preprocess
        class_names = sorted(set(items["class"]))
        class_of = {name: k for k, name in enumerate(class_names)}
        scorer = AlignmentScorer(clip_model, tokenizer, class_names, prompt, device)
        class_index = torch.as_tensor([class_of[c] for c in items["class"]], dtype=torch.long)
        num_workers = min(8, os.cpu_count() or 1) if num_workers is None else num_workers
        loader = torch.utils.data.DataLoader(
            _ImageFiles(items["abs_path"].to_numpy()[todo], image_transform),
            batch_size=batch_size, shuffle=False, pin_memory=device.type == "cuda",
            num_workers=max(0, min(num_workers, -(-len(todo) // batch_size))))
        todo_t = torch.as_tensor(todo, dtype=torch.long)
        desc = f"scoring {len(todo)} images"
        if sys.stderr.isatty():
            from tqdm import tqdm

            progress = tqdm(total=len(todo), desc=desc, unit="img", leave=False, file=sys.stderr)
        else:
            progress = _PlainProgress(len(todo), desc)
        results = []
        score_start = time.perf_counter()
        with contextlib.closing(progress):
            for images, position in loader:
                results.append(scorer.score_batch(images, class_index[todo_t[position]]))
                progress.update(len(position))
        computed = torch.cat(results).cpu().numpy().astype(np.float64)
        run.scoring_seconds = time.perf_counter() - score_start
        scores[todo] = computed
        if cache is not None:
            cache.update([keys[i] for i in todo], computed)
    if cache is not None:
        cache.save()  # also a corrupt file's replacement when every score was computed before

    frame = items.drop(columns=["abs_path"]).copy()
    frame["score"] = scores.astype(np.float32).astype(np.float64)
    meta = {"dataset": dataset_name or type(dataset).__name__, "model": model,
            "pretrained": "none" if random_init else str(pretrained),
            "pretrained_sha256": sha, "pretrained_tag": pretrained_tag, "prompt": prompt,
            "transform": setting["transform"], "data_dir": os.path.abspath(data_dir)
            if data_dir else None,
            FINGERPRINT_KEY: table_fingerprints(frame["env"].to_numpy(), frame["path"].to_numpy(),
                                                [st.st_size for st in stats]),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "open_clip": getattr(open_clip, "__version__", "?")}
    if random_init:
        meta["seed"] = int(seed)
        run.notes.append("random weights (--pretrained none): these scores measure nothing")
    run.table = ScoreTable(frame, meta)
    run.seconds = time.perf_counter() - start
    return run
