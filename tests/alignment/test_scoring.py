"""Scoring: the score is the raw cosine of open_clip's normalised embeddings for the true class's
prompt (folder name), on the dataset's evaluation transform; batches, checkpoints, offline."""

import os
import shutil
import time

import numpy as np
import pytest
import torch

from dg_plugins.alignment import scoring
from dg_plugins.datasets.image_folder import ImageFolder, load_rgb_image
from dg_plugins.networks.pretrained import PretrainedWeightsUnavailable


def direct_cosines(model, tokenizer, transform, paths, class_names, prompt="A photo of {}."):
    """Cosines computed one image at a time from open_clip's own normalised embeddings."""
    out = []
    with torch.no_grad():
        for path, name in zip(paths, class_names):
            image = model.encode_image(transform(load_rgb_image(path))[None], normalize=True)
            text = model.encode_text(tokenizer([prompt.replace("{}", name)]), normalize=True)
            out.append(float((image * text).sum()))
    return np.asarray(out)


def test_score_is_the_raw_cosine_for_the_true_class(pacs, pacs_dir, tiny_model):
    run = scoring.score_dataset(pacs, [0, 3], pacs_dir, model=tiny_model, pretrained="none",
                                seed=3, batch_size=7, num_workers=0, use_cache=False)
    frame = run.table.frame
    assert run.n_computed == len(frame) == len(pacs[0]) + len(pacs[3])
    model, _, tokenizer = scoring.load_clip(tiny_model, "none", "cpu", seed=3)
    paths = [os.path.join(pacs_dir, p) for p in frame["path"]]
    expected = direct_cosines(model, tokenizer, pacs.plain_transform, paths, frame["class"])
    np.testing.assert_allclose(frame["score"], expected, atol=2e-6)
    # the true class: the class folder of each image, and the label the dataset gives it
    assert all(p.split("/")[-2] == c for p, c in zip(frame["path"], frame["class"]))
    assert [pacs.classes[y] for y in frame["label"]] == list(frame["class"])
    # not a softmax over classes, not scaled: a prompt of another class gives another cosine
    wrong = direct_cosines(model, tokenizer, pacs.plain_transform, paths[:3], ["house"] * 3)
    assert not np.allclose(wrong, expected[:3])
    assert -1 <= frame["score"].min() and frame["score"].max() <= 1


def test_batch_size_and_workers_do_not_change_scores(pacs, pacs_dir, tiny_model):
    one = scoring.score_dataset(pacs, [1], pacs_dir, model=tiny_model, pretrained="none",
                                batch_size=1, num_workers=0, use_cache=False).table.frame
    many = scoring.score_dataset(pacs, [1], pacs_dir, model=tiny_model, pretrained="none",
                                 batch_size=16, num_workers=2, use_cache=False).table.frame
    np.testing.assert_allclose(one["score"], many["score"], atol=2e-6)
    assert list(one["path"]) == list(many["path"])


def test_prompts_use_the_class_folder_name_as_it_is(tmp_path, pacs_dir, tiny_model):
    source = os.path.join(pacs_dir, "PACS", "photo", "dog")
    image = os.path.join(source, sorted(os.listdir(source))[0])
    for domain in ("d1", "d2"):
        for cls in ("aircraft_carrier", "The Eiffel Tower"):
            os.makedirs(tmp_path / domain / cls)
            shutil.copy(image, tmp_path / domain / cls / "x.jpg")
    dataset = ImageFolder(str(tmp_path), [], {"data_augmentation": False})
    model, _, tokenizer = scoring.load_clip(tiny_model, "none")
    scorer = scoring.AlignmentScorer(model, tokenizer, dataset.classes)
    assert scorer.prompts == ["A photo of The Eiffel Tower.", "A photo of aircraft_carrier."]
    custom = scoring.AlignmentScorer(model, tokenizer, dataset.classes, prompt="a {} photo")
    assert custom.prompts[1] == "a aircraft_carrier photo"
    run = scoring.score_dataset(dataset, None, str(tmp_path), model=tiny_model,
                                pretrained="none", num_workers=0, use_cache=False)
    frame = run.table.frame
    assert set(frame["class"]) == {"aircraft_carrier", "The Eiffel Tower"}
    # same image, two classes: the two prompts give two different scores, as computed directly
    expected = direct_cosines(model, tokenizer, dataset.plain_transform,
                              [str(tmp_path / p) for p in frame["path"]], frame["class"])
    np.testing.assert_allclose(frame["score"], expected, atol=2e-6)
    assert frame["score"].nunique() == 2
    with pytest.raises(ValueError, match="exactly one"):
        scoring.AlignmentScorer(model, tokenizer, dataset.classes, prompt="A photo")


def test_the_evaluation_transform_is_the_datasets(pacs, pacs_dir, tiny_model):
    from torchvision import transforms

    default = scoring.score_dataset(pacs, [2], pacs_dir, model=tiny_model, pretrained="none",
                                    num_workers=0, use_cache=False).table
    explicit = scoring.score_dataset(pacs, [2], pacs_dir, model=tiny_model, pretrained="none",
                                     transform=pacs.plain_transform, num_workers=0,
                                     use_cache=False).table
    np.testing.assert_array_equal(default.frame["score"], explicit.frame["score"])
    text = default.meta["transform"]
    assert text.startswith("dataset-eval:") and "Resize(size=(224, 224)" in text
    assert "Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))" in text
    # another transform (no ImageNet normalisation; CLIP's own preprocessing) changes the scores
    other = transforms.Compose([transforms.Resize((224, 224)), transforms.ToTensor()])
    unnormalised = scoring.score_dataset(pacs, [2], pacs_dir, model=tiny_model,
                                         pretrained="none", transform=other, num_workers=0,
                                         use_cache=False).table
    clip = scoring.score_dataset(pacs, [2], pacs_dir, model=tiny_model, pretrained="none",
                                 transform="clip", num_workers=0, use_cache=False).table
    for changed in (unnormalised, clip):
        assert np.abs(changed.frame["score"] - default.frame["score"]).max() > 1e-4
    assert clip.meta["transform"].startswith("open_clip preprocess_val")


def test_local_checkpoint_as_pretrained(tmp_path, pacs, pacs_dir, tiny_model, cache_dir):
    model, _, tokenizer = scoring.load_clip(tiny_model, "none", seed=11)
    checkpoint = tmp_path / "tiny.pt"
    torch.save(model.state_dict(), checkpoint)
    run = scoring.score_dataset(pacs, [0], pacs_dir, model=tiny_model,
                                pretrained=str(checkpoint), num_workers=0, cache_dir=cache_dir)
    frame = run.table.frame
    expected = direct_cosines(model, tokenizer, pacs.plain_transform,
                              [os.path.join(pacs_dir, p) for p in frame["path"]], frame["class"])
    np.testing.assert_allclose(frame["score"], expected, atol=2e-6)
    assert run.table.meta["pretrained"] == str(checkpoint)
    assert len(run.table.meta["pretrained_sha256"]) == 64
    # another checkpoint at the same path: another hash, so the cache misses
    other, _, _ = scoring.load_clip(tiny_model, "none", seed=12)
    time.sleep(0.01)
    torch.save(other.state_dict(), checkpoint)
    again = scoring.score_dataset(pacs, [0], pacs_dir, model=tiny_model,
                                  pretrained=str(checkpoint), num_workers=0, cache_dir=cache_dir)
    assert again.n_computed == len(frame)
    assert again.table.meta["pretrained_sha256"] != run.table.meta["pretrained_sha256"]


def test_offline_fails_fast_with_the_fix(pacs, pacs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))
    start = time.perf_counter()
    with pytest.raises(PretrainedWeightsUnavailable) as err:
        scoring.score_dataset(pacs, [0], pacs_dir, use_cache=False)  # ViT-B-16 laion400m_e32
    assert time.perf_counter() - start < 5
    message = str(err.value)
    assert "--pretrained /path/to/" in message and "laion400m_e32" in message
    assert "offline" in message
    with pytest.raises(ValueError, match="neither a checkpoint file nor a pretrained tag.*"
                                         "laion400m_e32"):
        scoring.check_weights_available("ViT-B-16", "laion5000")
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        scoring.check_weights_available("ViT-B-16", str(tmp_path / "missing.bin"))
    with pytest.raises(ValueError, match="unknown open_clip model"):
        scoring.model_config("ViT-X-99")


def test_cli_offline_exits_with_the_message(pacs_dir, tmp_path, monkeypatch, capsys):
    from dg_plugins.scripts import alignment_scores
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    code = alignment_scores.main(["--dataset", "PACS", "--data_dir", pacs_dir, "--out",
                                  str(tmp_path / "s.csv"), "--cache_dir", str(tmp_path / "c")])
    assert code == 2
    err = capsys.readouterr().err
    assert "error: CLIP weights for ViT-B-16 laion400m_e32 are not cached" in err
    assert not (tmp_path / "s.csv").exists()


def test_in_memory_dataset_is_rejected():
    from dg_plugins.datasets.debug import Debug28

    with pytest.raises(ValueError, match="no image paths"):
        scoring.score_dataset(Debug28(None, [], {}), [0], None, pretrained="none")


def test_a_replaced_checkpoint_of_same_size_and_mtime_is_hashed_again(
        tmp_path, pacs, pacs_dir, tiny_model, cache_dir):
    """The checkpoint-hash memo must not serve the old file's hash (and so the old model's cached
    scores) for a file replaced in place with the same size and a restored mtime."""
    checkpoint = tmp_path / "tiny.pt"
    models = [scoring.load_clip(tiny_model, "none", seed=s)[0] for s in (21, 22)]
    torch.save(models[0].state_dict(), checkpoint)
    first = scoring.score_dataset(pacs, [1], pacs_dir, model=tiny_model,
                                  pretrained=str(checkpoint), num_workers=0, cache_dir=cache_dir)
    stat = os.stat(checkpoint)
    (tmp_path / "new").mkdir()
    replacement = tmp_path / "new" / "tiny.pt"  # torch.save's archive is named by the file
    torch.save(models[1].state_dict(), replacement)
    assert os.path.getsize(replacement) == stat.st_size  # same architecture, same size
    os.replace(replacement, checkpoint)
    os.utime(checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(checkpoint).st_mtime_ns == stat.st_mtime_ns
    again = scoring.score_dataset(pacs, [1], pacs_dir, model=tiny_model,
                                  pretrained=str(checkpoint), num_workers=0, cache_dir=cache_dir)
    import hashlib

    assert again.table.meta["pretrained_sha256"] == hashlib.sha256(
        checkpoint.read_bytes()).hexdigest() != first.table.meta["pretrained_sha256"]
    assert again.n_computed == len(again.table.frame) and again.n_cached == 0
    assert np.abs(again.table.frame["score"] - first.table.frame["score"]).max() > 1e-4
    # the same file, untouched: the memo and the cache serve it
    third = scoring.score_dataset(pacs, [1], pacs_dir, model=tiny_model,
                                  pretrained=str(checkpoint), num_workers=0, cache_dir=cache_dir)
    assert third.n_computed == 0
    np.testing.assert_array_equal(third.table.frame["score"], again.table.frame["score"])


def test_rates_are_readable_at_any_speed(capsys):
    assert scoring.format_rate(455, 10) == "45.5 img/s"
    assert scoring.format_rate(1, 1) == "1.0 img/s"
    assert scoring.format_rate(2, 47) == "23.5 s/img"  # 0.04 img/s, printed "0.0 img/s" before
    assert scoring.format_rate(0, 3) == "-" and scoring.format_rate(5, 0) == "-"
    progress = scoring._PlainProgress(40, "scoring 40 images")
    progress.start -= 120.0  # four images in two minutes: a loaded CPU scoring ViT-B-16
    progress.update(4)  # 10%: a line
    line = capsys.readouterr().err.strip()
    assert line.startswith("scoring 40 images: 4/40 images (") and line.endswith(" s/img)")
    assert 30.0 <= float(line.split("(")[1].split()[0]) < 35


def fake_hub_cache(cache, repo_id: str, files: dict) -> None:
    """A Hugging Face cache holding ``files`` (name -> bytes) of ``repo_id`` at revision main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)


def test_weights_in_the_hub_cache_are_used_without_any_request(tmp_path, monkeypatch):
    """Cache first: cached weights are found without asking the hub, and open_clip then loads
    them with the hub client offline, so a dead or slow endpoint costs nothing (not offline mode:
    any socket connection fails the test)."""
    import io
    import json
    import socket

    import huggingface_hub.constants as constants

    from alignment_helpers import TINY_CONFIG

    cache = tmp_path / "hub"
    fake_hub_cache(cache, "timm/vit_base_patch16_clip_224.laion400m_e32",
                   {"open_clip_pytorch_model.bin": b"weights"})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("DG_PLUGINS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    from dg_plugins.networks import pretrained

    monkeypatch.setattr(pretrained, "probe_url", lambda *a, **k: pytest.fail("asked the hub"))
    assert scoring.check_weights_available("ViT-B-16", "laion400m_e32") is True

    # an hf-hub: model (config + weights from the hub), cached: loaded with no connection at all
    source = tmp_path / "dg-hub-tiny.json"
    source.write_text(json.dumps(TINY_CONFIG))
    tiny = scoring.add_model_config(str(source))
    expected, _, _ = scoring.load_clip(tiny, "none", seed=5)
    buffer = io.BytesIO()
    torch.save(expected.state_dict(), buffer)
    fake_hub_cache(cache, "dg-test/tiny-clip", {
        "open_clip_config.json": json.dumps({"model_cfg": TINY_CONFIG}).encode(),
        "open_clip_pytorch_model.bin": buffer.getvalue()})

    attempts = []

    def no_network(self, address):  # the hub client swallows errors: record the attempts
        if isinstance(address, tuple):
            attempts.append(address)
            raise ConnectionRefusedError("no network in this test")
        return connect(self, address)

    connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # were a request made
    loaded, _, _ = scoring.load_clip("hf-hub:dg-test/tiny-clip", "none", seed=6)
    assert attempts == []
    for (name, a), b in zip(expected.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert constants.HF_HUB_OFFLINE is False  # the offline block ended with the load


GUARD = '''"""Test guard: the process may open network connections to loopback addresses only; every
attempt is logged to $DG_TEST_NET_LOG (time, kind, host, port), and the exit time too."""
import atexit, os, socket, time

_LOG = os.environ["DG_TEST_NET_LOG"]
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _log(kind, host, port):
    with open(_LOG, "a") as f:
        f.write(f"{time.monotonic()}\\t{kind}\\t{host}\\t{port}\\n")


_getaddrinfo = socket.getaddrinfo


def getaddrinfo(host, port, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name is not None and name not in _LOOPBACK:
        _log("blocked", name, port)
        raise socket.gaierror(socket.EAI_NONAME, "blocked by the test: not a loopback address")
    return _getaddrinfo(host, port, *args, **kwargs)


_connect = socket.socket.connect


def connect(self, address):
    if isinstance(address, tuple):
        if address[0] not in _LOOPBACK:
            _log("blocked", address[0], address[1])
            raise ConnectionRefusedError("blocked by the test: not a loopback address")
        _log("connect", address[0], address[1])
    return _connect(self, address)


socket.getaddrinfo = getaddrinfo
socket.socket.connect = connect
atexit.register(_log, "exit", "-", "-")
'''


def test_cli_fails_at_once_when_the_hub_endpoint_does_not_answer(tmp_path):
    """Not offline (no HF_HUB_OFFLINE), nothing cached, the hub endpoint (HF_ENDPOINT) a closed
    port on 127.0.0.1: the scorer asks it once, without retries, and exits with the fixes, instead
    of the hub client's minutes of retries. No other address may be contacted (a guard refuses and
    logs any)."""
    import socket

    from support.image_tree import make_pacs_tree
    from support.processes import command_env, run

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    log = tmp_path / "net.log"
    env = command_env(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"),
                      DG_TEST_NET_LOG=str(log))
    for name in ("HF_HUB_OFFLINE", "DG_PLUGINS_OFFLINE", "HF_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(guard), env["PYTHONPATH"]])
    data_dir = make_pacs_tree(tmp_path / "data", per_class=1)
    code, output = run("dg_plugins.scripts.alignment_scores", "--dataset", "PACS", "--data_dir",
                       data_dir, "--cache_dir", tmp_path / "cache", "--out", tmp_path / "s.csv",
                       env=env, timeout=120)
    assert code == 2, output
    assert (f"error: CLIP weights for ViT-B-16 laion400m_e32 are not cached and cannot be "
            f"downloaded (the hub endpoint http://127.0.0.1:{port} is unreachable") in output
    assert "--pretrained /path/to/open_clip_pytorch_model.bin --pretrained_tag" in output
    assert not (tmp_path / "s.csv").exists()
    events = [line.split("\t") for line in log.read_text().splitlines()]
    assert not [e for e in events if e[1] == "blocked"], events  # only the endpoint was asked
    asked = [float(e[0]) for e in events if e[1] == "connect" and e[3] == str(port)]
    exited = [float(e[0]) for e in events if e[1] == "exit"]
    assert len(asked) == 1 and len(exited) == 1, events  # one request, no retries
    assert exited[0] - asked[0] < 10  # the hub client's retries alone take 23 s per file


URL_WEIGHTS = "dg_tiny_url_weights.pt"


def test_weights_of_a_url_tag_are_looked_for_and_loaded_in_the_runs_own_clip_cache(
        tiny_model, monkeypatch):
    """A tag whose weights open_clip downloads from a URL (no hub entry: older open_clip's OpenAI
    tags) is looked for, and loaded, in ``$XDG_CACHE_HOME/clip``: here the test run's own cache
    (tests/conftest.py), not the user's ``~/.cache/clip``. Offline, never asked."""
    url_tag_checks(tiny_model, monkeypatch)


def url_tag_checks(tiny_model, monkeypatch):
    """The test above."""
    import socket

    import open_clip

    with socket.socket() as sock:  # a port on 127.0.0.1 where nothing listens
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/{URL_WEIGHTS}"
    monkeypatch.setitem(open_clip.pretrained._PRETRAINED, tiny_model,
                        {"dg_url": open_clip.pretrained._pcfg(url=url)})
    cache = os.path.join(os.environ["XDG_CACHE_HOME"], "clip")
    assert scoring.clip_url_cache() == cache
    target = os.path.join(cache, URL_WEIGHTS)
    with pytest.raises(PretrainedWeightsUnavailable) as err:  # not cached, and offline
        scoring.check_weights_available(tiny_model, "dg_url")
    assert target in str(err.value)

    saved, _, _ = scoring.load_clip(tiny_model, "none", seed=5)
    os.makedirs(cache, exist_ok=True)
    torch.save(saved.state_dict(), target)
    try:
        assert scoring.check_weights_available(tiny_model, "dg_url") is False  # found: no probe
        loaded, _, _ = scoring.load_clip(tiny_model, "dg_url")  # open_clip reads the same file
        for (name, value), other in zip(saved.state_dict().items(),
                                        loaded.state_dict().values()):
            assert torch.equal(value, other), name
    finally:
        os.remove(target)


def test_the_url_tag_test_passes_with_the_weights_in_the_users_own_clip_cache(
        tmp_path, tiny_model, monkeypatch):
    """The test above passes, and writes nothing there, when the user's home holds the very file
    in ``~/.cache/clip`` (open_clip's own default folder; it failed then: the file was found).
    Run in this process with ``$HOME`` that home (``$XDG_CACHE_HOME`` is the run's own, as
    tests/conftest.py sets it for any user's value: tests/test_run_caches.py)."""
    home = tmp_path / "home"
    (home / ".cache" / "clip").mkdir(parents=True)
    (home / ".cache" / "clip" / URL_WEIGHTS).write_bytes(b"the user's weights")
    before = sorted((p, p.stat().st_size) for p in home.rglob("*"))
    monkeypatch.setenv("HOME", str(home))
    assert os.path.expanduser("~/.cache/clip") == str(home / ".cache" / "clip")
    url_tag_checks(tiny_model, monkeypatch)
    assert sorted((p, p.stat().st_size) for p in home.rglob("*")) == before
