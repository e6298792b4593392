"""Featurizer choice, stage access, random-init and local-checkpoint backbones, offline
fail-fast."""

import os
import time

import pytest
import torch

from dg_plugins import hparams as hparams_lib
from dg_plugins.networks import (MNIST_CNN, Classifier, Featurizer, LeNet,
                                 PretrainedWeightsUnavailable, ResNet, ViTFeaturizer,
                                 backbone_for)

#: How often the loopback servers look for shutdown (seconds; 0.5 by default).
SERVER_POLL_S = 0.01


def hp(dataset="PACS", **overrides):
    h = hparams_lib.default_hparams("ERM", dataset)
    h.update(pretrained=False, resnet50_augmix=False, resnet18=True)
    h.update(overrides)
    return h


def test_featurizer_is_chosen_by_input_shape_or_the_backbone_hparam():
    shaped = {k: v for k, v in hp().items() if k != "image_size"}  # not an image folder's
    assert isinstance(Featurizer((2, 28, 28), hp("Debug28")), MNIST_CNN)
    assert isinstance(Featurizer((3, 32, 32), shaped), LeNet)
    assert isinstance(Featurizer((3, 224, 224), hp()), ResNet)
    assert backbone_for((3, 224, 224), hp(vit=True)) == "vit"
    with pytest.raises(ValueError, match=r"no automatic backbone for input shape \(3, 64, 64\)"
                                         r".*hparam 'backbone'"):
        Featurizer((3, 64, 64), shaped)
    # an image folder's images (its image_size hparam): the ResNet, or the ViT, at any size
    assert backbone_for((3, 32, 32), hp()) == backbone_for((3, 64, 64), hp()) == "resnet"
    assert backbone_for((3, 64, 64), hp(vit=True)) == "vit"
    assert isinstance(Featurizer((3, 64, 64), hp(backbone="resnet")), ResNet)
    net = Featurizer((3, 64, 64), hp(backbone="mnist_cnn"))
    assert isinstance(net, MNIST_CNN) and net(torch.randn(2, 3, 64, 64)).shape == (2, 128)


def test_a_dataset_names_its_default_backbone():
    from dg_plugins import catalog

    catalog.declare_dataset("TestDigits32", ["a", "b"], backbone="lenet")
    assert hparams_lib.default_hparams("ERM", "TestDigits32")["backbone"] == "lenet"
    assert hparams_lib.default_hparams("ERM", "PACS")["backbone"] == "auto"


@pytest.mark.parametrize("make, shape, stage", [
    (lambda: MNIST_CNN((1, 28, 28), width=32), (2, 1, 28, 28), "block4"),
    (lambda: LeNet((3, 32, 32)), (2, 3, 32, 32), "fc1"),
    (lambda: ResNet((3, 224, 224), hp()), (2, 3, 224, 224), "layer3"),
    (lambda: ViTFeaturizer((1, 28, 28), hp(vit_arch="auto")), (2, 1, 28, 28), "block5"),
])
def test_stages_compose_to_the_whole_network_and_hooks_see_stage_inputs(make, shape, stage):
    torch.manual_seed(0)
    net = make().eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        whole = net(x)
        h = net.forward_stages(x, stop=stage)
        assert h.shape[net.channel_dim] == net.stage_widths[stage]
        torch.testing.assert_close(net.forward_stages(h, start=stage), whole)
        seen = {}

        def zero_half(t, name=stage):
            seen[name] = t.shape
            t = t.clone().movedim(net.channel_dim, 1)
            t[:, : t.shape[1] // 2] = 0
            return t.movedim(1, net.channel_dim)

        hooked = net.forward_stages(x, hooks={stage: zero_half})
        assert seen[stage] == h.shape and not torch.allclose(hooked, whole)
        manual = net.forward_stages(zero_half(h), start=stage)
        torch.testing.assert_close(hooked, manual)
    assert whole.shape == (2, net.n_outputs)
    with pytest.raises(ValueError, match="has no stage 'nope'; its stages are"):
        net.forward_stages(x, stop="nope")


def test_resnet_stage_widths_match_torchvision_and_timm_layouts():
    assert ResNet((3, 224, 224), hp()).stage_widths == {
        "layer1": 64, "layer2": 64, "layer3": 128, "layer4": 256}
    timm_r50 = ResNet((3, 224, 224), hp(resnet18=False, resnet50_augmix=True))
    assert timm_r50.stage_widths == {"layer1": 64, "layer2": 256, "layer3": 512, "layer4": 1024}
    timm_r50.eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(timm_r50(x), timm_r50.network(x))


def test_lenet_layout():
    net = LeNet((3, 32, 32))
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [
        (3, 64, (5, 5)), (64, 128, (5, 5))]
    assert [(m.in_features, m.out_features) for m in linears] == [(128 * 5 * 5, 1024),
                                                                  (1024, 1024)]
    with pytest.raises(ValueError, match="at least 16x16"):
        LeNet((3, 12, 12))


def test_mnist_cnn_matches_domainbeds_layout_and_width_option():
    net = MNIST_CNN((1, 28, 28))
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.stride[0]) for c in convs] == [
        (1, 64, 1), (64, 128, 2), (128, 128, 1), (128, 128, 1)]
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 128)
    narrow = MNIST_CNN((1, 28, 28), width=32)
    assert narrow.n_outputs == 32 and narrow(torch.randn(2, 1, 28, 28)).shape == (2, 32)
    with pytest.raises(ValueError, match="multiple of 16"):
        MNIST_CNN((1, 28, 28), width=20)


def test_resnet_channel_adaptation_copies_filters_modulo_3():
    net = ResNet((5, 224, 224), hp())
    w = net.network.conv1.weight
    assert w.shape[1] == 5 and torch.equal(w[:, 3], w[:, 0]) and torch.equal(w[:, 4], w[:, 1])
    assert net(torch.randn(2, 5, 224, 224)).shape == (2, 512)


def test_freeze_bn_survives_train():
    net = ResNet((3, 224, 224), hp(freeze_bn=True)).train()
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)


def test_local_checkpoint_is_loaded(tmp_path):
    source = ResNet((3, 224, 224), hp())
    path = tmp_path / "weights.pth"
    torch.save({"state_dict": {"module." + k: v for k, v in source.network.state_dict().items()}},
               path)
    loaded = ResNet((3, 224, 224), hp(pretrained=True, pretrained_path=str(path)))
    assert torch.equal(loaded.network.conv1.weight, source.network.conv1.weight)
    with pytest.raises(FileNotFoundError, match="pretrained_path"):
        ResNet((3, 224, 224), hp(pretrained=True, pretrained_path=str(tmp_path / "none.pth")))


@pytest.mark.parametrize("overrides, what", [
    ({"resnet50_augmix": True, "resnet18": False}, "timm resnet50.ram_in1k"),
    ({"resnet50_augmix": False, "resnet18": False}, "torchvision resnet50"),
])
def test_offline_pretrained_weights_fail_fast_with_the_fixes(overrides, what):
    start = time.time()
    with pytest.raises(PretrainedWeightsUnavailable) as err:
        ResNet((3, 224, 224), hp(pretrained=True, **overrides))
    assert time.time() - start < 30  # no hub retry loop
    message = str(err.value)
    assert what in message and "pretrained_path" in message and '"pretrained": false' in message
    assert "HF_HUB_OFFLINE" in message


def offline_probe(imports: str, build: str, module: str) -> list[str]:
    """In a fresh offline process: the type of the error :func:`probe_weights` finds for
    ``build``, and whether ``module`` was imported."""
    import subprocess
    import sys

    code = (f"import sys; {imports}; from dg_plugins.networks.pretrained import probe_weights; "
            f"error = probe_weights(lambda: {build}); "
            f"print(type(error).__name__, {module!r} in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, DG_PLUGINS_OFFLINE="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_torchvision_resnet_weights_are_known_before_torchvision_is_imported():
    """The URLs checked before importing torchvision are its enums' ``IMAGENET1K_V1``; a probe
    of a pretrained ResNet (a dry run's prerequisites) stops there, without importing it."""
    import torchvision

    from dg_plugins.networks import featurizers

    for name, enum, _, url in featurizers._TORCHVISION_RESNETS.values():
        assert getattr(torchvision.models, enum).IMAGENET1K_V1.url == url, name
    assert offline_probe("from dg_plugins.networks import ResNet",
                         "ResNet((3, 224, 224), {'resnet18': False, 'resnet50_augmix': False, "
                         "'pretrained': True})", "torchvision") == \
        ["PretrainedWeightsUnavailable", "False"]


def test_timm_weights_are_known_before_timm_is_imported():
    """Every timm model our networks download by default has its hub repository in
    ``TIMM_HUB_IDS``, equal to timm's config (default file names); a probe of a pretrained ViT
    stops at that check, without importing timm."""
    import timm

    from dg_plugins.algorithms.gmoe import DEIT_S
    from dg_plugins.networks import featurizers, pretrained, vit

    defaults = {vit.DEFAULT_ARCH_224, vit.DINOV2_ARCH, DEIT_S, featurizers.TIMM_AUGMIX_RESNET}
    assert set(pretrained.TIMM_HUB_IDS) == defaults
    for name, repo in pretrained.TIMM_HUB_IDS.items():
        cfg = timm.models.get_pretrained_cfg(name)
        assert (cfg.hf_hub_id, cfg.hf_hub_filename) == (repo, None), name
    assert offline_probe("from dg_plugins.networks.vit import create_vit",
                         "create_vit('auto', (3, 224, 224), pretrained=True)", "timm") == \
        ["PretrainedWeightsUnavailable", "False"]


def test_timm_vit_featurizer():
    net = Featurizer((3, 224, 224), hp(vit=True, vit_arch="vit_tiny_patch16_224"))
    assert isinstance(net, ViTFeaturizer) and net.n_outputs == 192
    assert net(torch.randn(2, 3, 224, 224)).shape == (2, 192)


def test_classifier_heads():
    assert isinstance(Classifier(128, 7), torch.nn.Linear)
    deep = Classifier(128, 7, is_nonlinear=True)
    assert [m.out_features for m in deep if isinstance(m, torch.nn.Linear)] == [64, 32, 7]


def test_an_explicit_resnet18_wins_over_the_resnet50_augmix_default():
    """DomainBed (networks.py, ResNet.__init__) replaces the ResNet-18 by the timm ResNet-50 when
    resnet50_augmix is true (its default): here resnet18 true builds a ResNet-18 either way, and
    resnet50_augmix only picks the ResNet-50's weights."""
    from dg_plugins.networks.featurizers import TIMM_AUGMIX_RESNET, resnet_arch

    r18 = ResNet((3, 224, 224), hp(resnet18=True, resnet50_augmix=True))
    assert r18.arch == "resnet18" and r18.n_outputs == 512
    assert sum(p.numel() for p in r18.network.parameters()) == 11_176_512  # ResNet-18 less fc
    assert r18(torch.randn(1, 3, 224, 224)).shape == (1, 512)
    assert resnet_arch(hp(resnet18=False, resnet50_augmix=True)) == TIMM_AUGMIX_RESNET
    assert resnet_arch(hp(resnet18=False, resnet50_augmix=False)) == "resnet50"
    assert resnet_arch(hparams_lib.default_hparams("ERM", "PACS")) == TIMM_AUGMIX_RESNET


def test_lenet_refuses_a_size_that_makes_it_huge_naming_the_count_and_the_fix():
    for shape in [(3, 32, 32), (1, 40, 56), (3, 88, 88)]:
        net = LeNet(shape)
        assert LeNet.num_parameters(shape) == sum(p.numel() for p in net.parameters())
    assert LeNet.num_parameters((3, 32, 32)) < 5_000_000
    with pytest.raises(ValueError) as err:
        Featurizer((3, 224, 224), hp(backbone="lenet"))
    message = str(err.value)
    assert f"{LeNet.num_parameters((3, 224, 224)):,} parameters" in message
    assert LeNet.num_parameters((3, 224, 224)) > 368_000_000
    assert "53x53x128" in message and '"backbone": "resnet"' in message and "32x32" in message


# Offline weights: the cache holds the file, else one request to the hub endpoint in use ---------

def fake_hub_cache(cache, repo_id: str, files: dict) -> None:
    """A Hugging Face cache holding ``files`` (name -> bytes) of ``repo_id`` at revision main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("0" * 40)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """Not offline, an empty Hugging Face cache, the hub endpoint ``hub.use(url)``; every network
    connection outside 127.0.0.1 is refused and recorded in ``hub.blocked``, those to 127.0.0.1
    in ``hub.connections``."""
    import socket
    import types

    import huggingface_hub.constants as constants

    state = types.SimpleNamespace(cache=tmp_path / "hub", blocked=[], connections=[])
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("DG_PLUGINS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(state.cache))

    def use(endpoint):  # what HF_ENDPOINT sets when huggingface_hub is imported
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            endpoint + "/{repo_id}/resolve/{revision}/{filename}")

    state.use = use
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host, *args, **kwargs):
        if host not in ("127.0.0.1", "localhost"):
            state.blocked.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "blocked by the test")
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(sock, address):
        if isinstance(address, tuple):
            if address[0] != "127.0.0.1":
                state.blocked.append(address)
                raise ConnectionRefusedError("blocked by the test")
            state.connections.append(address)
        return real_connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    return state


@pytest.fixture
def answering_server():
    """An HTTP server on 127.0.0.1 that answers every HEAD with 404; ``.asked`` lists the paths."""
    import http.server
    import threading

    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    server.asked = asked
    thread = threading.Thread(target=server.serve_forever, args=(SERVER_POLL_S,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AUGMIX_REPO = "timm/resnet50.ram_in1k"


def augmix_resnet():
    return ResNet((3, 224, 224), hp(pretrained=True, resnet50_augmix=True, resnet18=False))


def test_a_repo_folder_without_its_weight_file_is_not_cached(hub):
    """The cache holds the repository's folder (e.g. an interrupted download, or another file of
    it) but not the weight file: not cached, so the endpoint in use (a closed port here) is
    asked, and the build fails at once naming that endpoint."""
    from dg_plugins.networks.pretrained import probe_weights

    port = closed_port()
    hub.use(f"http://127.0.0.1:{port}")
    fake_hub_cache(hub.cache, AUGMIX_REPO, {"config.json": b"{}"})
    error = probe_weights(augmix_resnet)
    assert isinstance(error, PretrainedWeightsUnavailable)
    assert (f"(the hub endpoint http://127.0.0.1:{port} is unreachable: "
            f"http://127.0.0.1:{port}/{AUGMIX_REPO}/resolve/main/pytorch_model.bin did not "
            "answer") in str(error)
    assert "pretrained_path" in str(error) and hub.blocked == []
    start = time.time()
    with pytest.raises(PretrainedWeightsUnavailable, match=f"127.0.0.1:{port} is unreachable"):
        augmix_resnet()
    assert time.time() - start < 30  # one request, no retry loop
    assert hub.blocked == []


def test_the_probe_asks_the_hub_endpoint_in_use_once(hub, answering_server):
    """HF_ENDPOINT names a (mirror) endpoint that answers: one HEAD request for the weight file,
    there and nowhere else (huggingface.co is never contacted), and the weights count as
    downloadable. Once the file is in the cache, nothing is asked at all."""
    from dg_plugins.networks.pretrained import probe_weights

    hub.use(f"http://127.0.0.1:{answering_server.server_address[1]}")
    assert probe_weights(augmix_resnet) is None
    assert answering_server.asked == [f"/{AUGMIX_REPO}/resolve/main/pytorch_model.bin"]
    assert hub.blocked == []
    fake_hub_cache(hub.cache, AUGMIX_REPO, {"model.safetensors": b"weights"})
    hub.connections.clear()
    assert probe_weights(augmix_resnet) is None
    assert hub.connections == [] and len(answering_server.asked) == 1


def test_timm_weights_in_the_cache_load_without_any_request(hub, tmp_path):
    """Cached timm weights are loaded with the hub client offline: the endpoint (a closed port)
    is never contacted, and the model holds the cached weights."""
    from safetensors.torch import save_file

    from dg_plugins.networks.pretrained import timm_model

    name = "test_vit.r160_in1k"
    hub.use(f"http://127.0.0.1:{closed_port()}")
    source = timm_model(name, False)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    fake_hub_cache(hub.cache, "timm/" + name, {"model.safetensors": path.read_bytes()})
    import huggingface_hub.constants as constants

    loaded = timm_model(name, True)
    assert hub.connections == [] and hub.blocked == []
    assert constants.HF_HUB_OFFLINE is False  # only while loading
    for (key, a), b in zip(source.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), key


def test_the_hub_probe_asks_once_and_takes_any_answer(tmp_path):
    """probe_url: a server that accepts but never answers is given up after the timeout (the hub
    client itself kept retrying such an endpoint for over 6 minutes for one file); any HTTP answer,
    an error status or a redirect (not followed), means the endpoint is up."""
    import http.server

    from dg_plugins.networks import pretrained
    import socket
    import threading

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)  # the kernel completes connections; nothing ever reads or answers
        reason = pretrained.probe_url(f"http://127.0.0.1:{silent.getsockname()[1]}/x", timeout=0.5)
    assert reason is not None and "did not answer" in reason and "timed out" in reason

    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            asked.append(self.path)
            self.send_response(404 if self.path == "/missing" else 302)
            self.send_header("Location", "http://192.0.2.1/elsewhere")  # never followed
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(SERVER_POLL_S,), daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert pretrained.probe_url(base + "/missing") is None
        assert pretrained.probe_url(base + "/moved") is None
    finally:
        server.shutdown()
        server.server_close()
    assert asked == ["/missing", "/moved"]  # one request each, the redirect not followed


def test_the_offline_test_passes_with_the_weights_in_the_users_own_caches(tmp_path):
    """tests/conftest.py gives the test run caches of its own: the offline fail-fast test above
    passes, and writes nothing, when the user's Hugging Face and torch.hub caches (here fake
    ones, named by the variables a user sets) hold the very weights it asks for (it failed then:
    the weights were found in the user's cache)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    user = tmp_path / "user"
    fake_hub_cache(user / "hf" / "hub", "timm/resnet50.ram_in1k",
                   {"model.safetensors": b"weights", "pytorch_model.bin": b"weights"})
    checkpoints = user / "torch" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "resnet50-0676ba61.pth").write_bytes(b"weights")
    before = sorted(p for p in user.rglob("*"))
    env = dict(os.environ, HF_HOME=str(user / "hf"), HF_HUB_CACHE=str(user / "hf" / "hub"),
               TORCH_HOME=str(user / "torch"), XDG_CACHE_HOME=str(user / "xdg"))
    test = "tests/networks/test_networks.py::test_offline_pretrained_weights_fail_fast_with_the_fixes"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider",
                           test], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:]
    assert sorted(p for p in user.rglob("*")) == before
