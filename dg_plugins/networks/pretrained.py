"""Offline-safe loading of pretrained backbone weights: decide from the cache, the offline
settings and one quick probe of the server, then load or fail at once with the fixes
(``docs/networks.md``). Shared by the backbones and the CLIP scorer."""

from __future__ import annotations

import contextlib
import os
import sys
from urllib.parse import urlparse

import torch

from dg_plugins.runtime import swapped

#: Seconds a download server gets to answer the one request (no retry) that tells whether
#: weights can be downloaded now.
PROBE_TIMEOUT = 3.0
OFFLINE_SET = "offline mode is set: HF_HUB_OFFLINE or DG_PLUGINS_OFFLINE"
#: timm's weight file names on the hub and their safetensors (``timm/models/_hub.py``).
TIMM_SAFE_ALTERNATIVES = {"pytorch_model.bin": "model.safetensors",
                          "open_clip_pytorch_model.bin": "open_clip_model.safetensors"}


class PretrainedWeightsUnavailable(RuntimeError):
    """Pretrained weights are neither cached nor downloadable."""


def offline_requested() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "DG_PLUGINS_OFFLINE"))


def probe_url(url: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """One HEAD request, no retry: None when a server answered, else why not."""
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # a 3xx is an answer; the download would follow it

    try:
        opener = urllib.request.build_opener(NoRedirect)
        with opener.open(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as err:  # a timeout is an OSError
        return f"{url} did not answer ({getattr(err, 'reason', err)}; {timeout:g} s allowed)"


def _unavailable(what: str, where: str, reason: str) -> PretrainedWeightsUnavailable:
    return PretrainedWeightsUnavailable(
        f"pretrained weights for {what} are not cached and cannot be downloaded ({reason}). "
        f"Fixes: run once with network access to fill the cache ({where}); or pass a local "
        "checkpoint with --hparams '{\"pretrained_path\": \"/path/to/weights.pth\"}'; or train "
        "from random initialisation with --hparams '{\"pretrained\": false}'. "
        "(HF_HUB_OFFLINE=1 makes hub look-ups fail at once instead of retrying.)"
    )


class WeightsRequested(BaseException):
    """Raised under :func:`probing` by the first weight request (``error``: what a job would
    meet); a BaseException, so that no ``except Exception`` swallows it."""

    def __init__(self, what: str, error: BaseException | None):
        super().__init__(what)
        self.what, self.error = what, error


_probing = False


def probing():
    """While active, a request for pretrained weights raises :class:`WeightsRequested`."""
    return swapped(sys.modules[__name__], "_probing", True)


def probe_weights(build) -> BaseException | None:
    """The error ``build()``'s first request for pretrained weights would raise in a job (None:
    none), found on the ``meta`` device without loading anything."""
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


_loaded: list[str] | None = None


def recording_weights():
    """Within the block, the yielded list describes each set of weights a model takes."""
    return swapped(sys.modules[__name__], "_loaded", [])


def note_weights(description: str) -> None:
    """Add ``description`` to :func:`recording_weights`' list (when recording)."""
    if _loaded is not None and not _probing:
        _loaded.append(description)


def _decided(what: str, error: BaseException | None) -> None:
    if _probing:
        raise WeightsRequested(what, error)
    if error is not None:
        raise error


def require_cached_or_reachable(what: str, cached: str, url: str,
                                unavailable=_unavailable) -> None:
    """Return when ``cached`` exists or ``url``'s server answers now; else raise ``unavailable``."""
    reason = None
    if not os.path.isfile(cached):
        reason = OFFLINE_SET if offline_requested() else probe_url(url)
    _decided(what, reason and unavailable(what, cached, reason))
    note_weights(f"{what} from the cache: {cached}" if os.path.isfile(cached) else
                 f"{what} downloaded from {url} into {cached}")


def check_url_available(url: str, what: str) -> None:
    name = os.path.basename(urlparse(url).path)  # in torch hub's checkpoint cache
    require_cached_or_reachable(what, os.path.join(torch.hub.get_dir(), "checkpoints", name), url)


def hub_cache_folder(repo_id: str) -> str:
    """Where the Hugging Face cache keeps ``repo_id`` (named in messages)."""
    from huggingface_hub import constants

    return os.path.join(constants.HF_HUB_CACHE, "models--" + repo_id.replace("/", "--"))


def check_hub_available(repo_id: str, what: str, groups, unavailable=_unavailable,
                        revision: str | None = None) -> bool:
    """True when every group of hub files has one cached (load under :func:`hub_offline`), False
    when not but the endpoint answers; else raise ``unavailable``."""
    from huggingface_hub import constants, hf_hub_url, try_to_load_from_cache

    groups = [list(names) for names in groups]
    # per group, the cached path of its first file in the hub cache, else None
    files = [next((path for path in (try_to_load_from_cache(repo_id, name, revision=revision)
                                     for name in names)
                   if isinstance(path, str) and os.path.isfile(path)), None) for names in groups]
    if all(files):
        _decided(what, None)
        note_weights(f"{what} from the Hugging Face cache: {', '.join(files)}")
        return True
    if offline_requested():
        reason = OFFLINE_SET
    else:
        reason = probe_url(hf_hub_url(repo_id, groups[-1][-1], revision=revision))
        reason = reason and f"the hub endpoint {constants.ENDPOINT} is unreachable: {reason}"
    _decided(what, reason and unavailable(what, hub_cache_folder(repo_id), reason))
    note_weights(f"{what} downloaded from the hub ({constants.ENDPOINT}, {repo_id}) into "
                 f"{hub_cache_folder(repo_id)}")
    return False


def hub_offline():
    """Within the block, the Hugging Face client makes no request (``HF_HUB_OFFLINE=1``)."""
    from huggingface_hub import constants

    return swapped(constants, "HF_HUB_OFFLINE", True)


def load_local_weights(model: torch.nn.Module, path: str, ignore_prefixes=("fc.", "head.")) -> None:
    """Load a local checkpoint into ``model``; keys other than the head must match."""
    _decided(path, None if os.path.isfile(path) else FileNotFoundError(
        f"pretrained_path {path!r} does not exist (expected a .pth/.pt file holding the "
        "backbone's state_dict)"))
    note_weights(f"the local file {path} (pretrained_path)")
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


def timm_hub_files(filename: str | None) -> list[str]:
    """The files timm tries, in order, for a hub weight file (safetensors first)."""
    filename = filename or "pytorch_model.bin"
    if filename.endswith(".bin"):  # TIMM_SAFE_ALTERNATIVES' keys among them
        return [TIMM_SAFE_ALTERNATIVES.get(filename, filename[:-4] + ".safetensors"), filename]
    return [filename]


#: The hub repositories of the timm models our networks download by default, checked before
#: timm is imported (so that a probe stops there); a later timm's other repository is checked too.
TIMM_HUB_IDS = {
    "vit_small_patch16_224.augreg_in21k_ft_in1k": "timm/vit_small_patch16_224.augreg_in21k_ft_in1k",
    "deit_small_patch16_224": "timm/deit_small_patch16_224.fb_in1k",
    "vit_base_patch14_dinov2.lvd142m": "timm/vit_base_patch14_dinov2.lvd142m",
    "resnet50.ram_in1k": "timm/resnet50.ram_in1k",
}


def timm_model(name: str, download: bool, **kwargs) -> torch.nn.Module:
    """``timm.create_model(name, pretrained=download, **kwargs)``, failing fast when the weights
    are neither cached nor downloadable."""
    what = f"timm {name}"
    known = TIMM_HUB_IDS.get(name) if download else None
    cached = check_hub_available(known, what, [timm_hub_files(None)]) if known else None
    from dg_plugins import compat  # noqa: F401  (before timm)
    import timm

    cfg = timm.models.get_pretrained_cfg(name) if download else None
    hub_id = getattr(cfg, "hf_hub_id", None)
    if hub_id:
        repo_id, _, revision = hub_id.partition("@")
        if hub_id != known or cfg.hf_hub_filename:  # not the files checked above
            cached = check_hub_available(repo_id, what, [timm_hub_files(cfg.hf_hub_filename)],
                                         revision=revision or None)
        with hub_offline() if cached else contextlib.nullcontext():
            return timm.create_model(name, pretrained=True, **kwargs)
    if cfg is not None and cfg.url and not cfg.file:
        check_url_available(cfg.url, what)
    return timm.create_model(name, pretrained=bool(download), **kwargs)
