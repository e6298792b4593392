"""plot_gmoe_routing: the per-patch expert maps and the PNG, on a fresh model and on a model.pkl
written by a train job."""

import json

import torch

import dg_plugins.datasets  # noqa: F401
from support.helpers import tiny_hparams
from dg_plugins.registry import DATASETS
from dg_plugins.scripts import plot_gmoe_routing as plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_routing_maps_are_each_patch_tokens_first_choice_expert():
    from dg_plugins.algorithms.gmoe import GMoE

    torch.manual_seed(0)
    dataset = DATASETS.get("Debug28")("", [], {})
    hp = tiny_hparams("GMoE", "Debug28", vit_arch="auto")  # the 6-block ViT: MoE in blocks 2, 4
    algorithm = GMoE(dataset.input_shape, dataset.num_classes, 2, hp)
    images = dataset[0].tensors[0][:3]
    maps = plot.routing_maps(algorithm, images)
    assert sorted(maps) == [2, 4]
    # independent: the router of block 2 on the LayerNorm'd input of that block's FFN
    vit = algorithm.network
    with torch.no_grad():
        tokens = vit._pos_embed(vit.patch_embed(images))
        tokens = vit.blocks[:2](tokens)
        block = vit.blocks[2]
        tokens = tokens + block.ls1(block.attn(block.norm1(tokens)))
        logits = block.mlp.router(block.norm2(tokens).reshape(-1, tokens.shape[-1]))
    expected = logits.argmax(1).reshape(3, -1)[:, 1:].reshape(3, 7, 7)
    assert torch.equal(maps[2], expected)
    assert all(layer.last_routing is None and not layer.record_experts
               for layer in algorithm.moe_layers)


def test_plot_from_a_fresh_model_writes_a_png(tmp_path):
    out = tmp_path / "routing.png"
    assert plot.main(["--dataset", "Debug28", "--out", str(out), "--images", "2",
                      "--envs", "0", "2"]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_plot_from_a_trained_model_pkl(tmp_path):
    from dg_plugins.train import run as train
    from dg_plugins.scripts.train import build_parser

    hp = {k: v for k, v in tiny_hparams("GMoE", "Debug28").items()
          if k in ("batch_size", "gmoe_router_dim")}
    job = tmp_path / "job"
    args = build_parser().parse_args([
        "--dataset", "Debug28", "--algorithm", "GMoE", "--output_dir", str(job), "--steps", "2",
        "--checkpoint_freq", "1", "--hparams", json.dumps(hp)])
    assert train.run(args) == "done"
    out = tmp_path / "trained.png"
    assert plot.main(["--model", str(job / "model.pkl"), "--out", str(out), "--images", "1"]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_a_model_without_moe_layers_is_refused(tmp_path, capsys):
    assert plot.main(["--out", str(tmp_path / "x.png")]) == 2
    assert "--model" in capsys.readouterr().err
