"""Offline-safe loading of pretrained backbone weights.

Weights come from the libraries' normal sources (torchvision's download server, the Hugging Face
Hub for timm and open_clip) and their caches. Offline, those downloads hang or retry (~46 s for the
hub); here we check cache and reachability first and fail at once with a message that says how to
provide weights: pre-fill the cache, point ``pretrained_path`` at a local checkpoint, or set
``pretrained`` false for random initialisation.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

import torch

HUB_HOST = "huggingface.co"


class PretrainedWeightsUnavailable(RuntimeError):
    """Pretrained weights are neither cached nor downloadable."""


def offline_requested() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "DG_PLUGINS_OFFLINE"))


def host_reachable(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _unavailable(what: str, where: str, reason: str) -> PretrainedWeightsUnavailable:
    return PretrainedWeightsUnavailable(
        f"pretrained weights for {what} are not cached and cannot be downloaded ({reason}). "
        f"Fixes: run once with network access to fill the cache ({where}); or pass a local "
        "checkpoint with --hparams '{\"pretrained_path\": \"/path/to/weights.pth\"}'; or train "
        "from random initialisation with --hparams '{\"pretrained\": false}'. "
        "(HF_HUB_OFFLINE=1 makes hub look-ups fail at once instead of retrying.)"
    )


def require_cached_or_reachable(what: str, cached: str, host: str,
                                unavailable=_unavailable) -> None:
    """Return when ``cached`` exists (a file or folder of a download cache) or ``host`` can be
    reached now; else raise ``unavailable(what, cached, reason)`` (default: the message with the
    fixes for a backbone; the CLIP scorer passes its own)."""
    if os.path.exists(cached):
        return
    if offline_requested():
        raise unavailable(what, cached, "offline mode is set")
    if not host_reachable(host):
        raise unavailable(what, cached, f"{host} is unreachable")


def check_url_available(url: str, what: str, cached: str | None = None,
                        unavailable=_unavailable) -> None:
    """Raise unless the download cache holds ``url``'s file (default: torch.hub's) or its host is
    reachable."""
    if cached is None:
        cached = os.path.join(torch.hub.get_dir(), "checkpoints",
                              os.path.basename(urlparse(url).path))
    require_cached_or_reachable(what, cached, urlparse(url).hostname or "", unavailable)


def check_hub_available(repo_id: str, what: str, unavailable=_unavailable) -> None:
    """Raise unless the Hugging Face cache holds ``repo_id`` or the hub is reachable."""
    from huggingface_hub import constants

    cache_dir = os.path.join(constants.HF_HUB_CACHE, "models--" + repo_id.replace("/", "--"))
    require_cached_or_reachable(what, cache_dir, HUB_HOST, unavailable)


def load_local_weights(model: torch.nn.Module, path: str, ignore_prefixes=("fc.", "head.")) -> None:
    """Load a local checkpoint into ``model`` (a state_dict, or a dict holding one under
    ``state_dict``/``model``; a ``module.`` prefix is stripped). Keys other than the classifier
    head must match; a mismatch raises with the offending keys."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"pretrained_path {path!r} does not exist (expected a .pth/.pt "
                                "file holding the backbone's state_dict)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    state = {k.removeprefix("module."): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.startswith(tuple(ignore_prefixes))}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(tuple(ignore_prefixes))]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path!r} does not fit the backbone: missing keys "
                         f"{missing[:5]}, unexpected keys {list(unexpected)[:5]}")


def timm_model(name: str, download: bool, **kwargs) -> torch.nn.Module:
    """``timm.create_model(name, pretrained=download, **kwargs)``, failing fast (with the fixes in
    the message) when the weights are neither cached nor downloadable."""
    from dg_plugins import compat  # noqa: F401  (before timm)
    import timm

    if download:
        cfg = timm.models.get_pretrained_cfg(name)
        repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
        check_hub_available(repo or name, f"timm {name}")
    return timm.create_model(name, pretrained=download, **kwargs)
