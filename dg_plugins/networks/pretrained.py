"""Offline-safe loading of pretrained backbone weights.

Weights come from the libraries' normal sources (torchvision's download server, the Hugging Face
Hub for timm and open_clip) and their caches. Offline, those downloads hang or retry (~46 s for the
hub); here we check cache and reachability first and fail at once with a message that says how to
provide weights: pre-fill the cache, point ``pretrained_path`` at a local checkpoint, or set
``pretrained`` false for random initialisation.

:func:`probe_weights` answers "would building this model fail for lack of weights?" without
loading or downloading anything: the sweep asks it once per configuration before launching
(``dg_plugins.engine.sweep.weight_problems``), so that a sweep offline with an empty cache fails
before any job starts.
"""

from __future__ import annotations

import contextlib
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


class WeightsRequested(BaseException):
    """Raised, under :func:`probe_weights`, by the first request for pretrained weights: it stops
    the model's construction there (nothing is loaded or downloaded). ``error``: the exception
    the request would raise in a job (None: the weights are available). A ``BaseException``, so
    that no ``except Exception`` in a model's constructor swallows it."""

    def __init__(self, what: str, error: BaseException | None):
        super().__init__(what)
        self.what = what
        self.error = error


_probing = False


@contextlib.contextmanager
def probing():
    """While active, a request for pretrained weights (:func:`require_cached_or_reachable`,
    :func:`load_local_weights`) raises :class:`WeightsRequested` instead of proceeding."""
    global _probing
    previous, _probing = _probing, True
    try:
        yield
    finally:
        _probing = previous


def probe_weights(build) -> BaseException | None:
    """Call ``build()`` (e.g. an algorithm's constructor) under :func:`probing`, on PyTorch's
    ``meta`` device (no memory, no initialisation cost; on CPU if that fails), and return the
    error its first request for pretrained weights would raise in a job: a
    :class:`PretrainedWeightsUnavailable` naming the fixes, a ``FileNotFoundError`` for a missing
    ``pretrained_path``; None when the weights are there or none are requested. Only the first
    request of a model is seen (every model of the package loads at most one set of weights).
    Other errors of ``build`` propagate."""
    for device in ("meta", "cpu"):
        try:
            with probing(), torch.device(device):
                build()
        except WeightsRequested as request:
            return request.error
        except Exception:
            if device == "cpu":
                raise
            continue
        return None
    return None


def require_cached_or_reachable(what: str, cached: str, host: str,
                                unavailable=_unavailable) -> None:
    """Return when ``cached`` exists (a file or folder of a download cache) or ``host`` can be
    reached now; else raise ``unavailable(what, cached, reason)`` (default: the message with the
    fixes for a backbone; the CLIP scorer passes its own). Under :func:`probing`, raise
    :class:`WeightsRequested` with that outcome instead."""
    error = None
    if os.path.exists(cached):
        pass
    elif offline_requested():
        error = unavailable(what, cached, "offline mode is set")
    elif not host_reachable(host):
        error = unavailable(what, cached, f"{host} is unreachable")
    if _probing:
        raise WeightsRequested(what, error)
    if error is not None:
        raise error


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
        error = FileNotFoundError(f"pretrained_path {path!r} does not exist (expected a .pth/.pt "
                                  "file holding the backbone's state_dict)")
        if _probing:
            raise WeightsRequested(path, error)
        raise error
    if _probing:
        raise WeightsRequested(path, None)
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
