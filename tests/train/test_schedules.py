"""The learning-rate schedules of the hparam ``lr_schedule`` (the DMG release's: exponential decay
per epoch, inverse decay per iteration; and inverse decay per epoch), applied by the train job
through ``Algorithm.set_lr_factor`` before every update: each optimizer's lr at every step, across
epoch boundaries, against the release's torch schedulers stepped as its trainer steps them; DMG's
mask optimizer left alone unless ``dmg_mask_lr_schedule``; a resume across an epoch boundary."""

import json

import pytest
import torch

import dg_plugins.datasets  # noqa: F401  (registers Debug28)
from dg_plugins.algorithms.base import lr_factor
from dg_plugins.train import loop
from dg_plugins.train import run as train
from dg_plugins.registry import ALGORITHMS
from dg_plugins.scripts.train import build_parser
from support.helpers import read_records, tiny_hparams

LR = 1e-3  # Debug28's default lr (DMG's mask lr defaults to it)


def release_exponential_lrs(steps, epoch_steps, decay):
    """The release's PACS schedule: ``ExponentialLR(decay)`` stepped once after every epoch
    (its trainer's epoch-mode branch); the lr each step uses."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(opt, decay)
    lrs = []
    for step in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()  # (no gradient: changes nothing; torch wants it before the scheduler's step)
        if (step + 1) % epoch_steps == 0:
            scheduler.step()
    return lrs


def release_inverse_lrs(steps, gamma, power):
    """The release's ``InvLR`` (``utils/inverse_lr_scheduler.py``): each step multiplies the lr by
    ``((1 + gamma t) / (1 + gamma (t - 1))) ** -power``; stepped after every iteration."""
    lr, lrs = LR, []
    for t in range(steps):
        lrs.append(lr)
        lr *= ((1 + gamma * (t + 1)) / (1 + gamma * t)) ** -power
    return lrs


def test_the_factors_follow_the_release_schedules_across_epoch_boundaries():
    hp = {"lr_schedule": "exp_epoch", "lr_decay": 0.9}
    ours = [LR * lr_factor(hp, step, 7.0) for step in range(30)]
    assert ours == pytest.approx(release_exponential_lrs(30, 7, 0.9), rel=1e-12)
    assert ours[6] == LR and ours[7] == pytest.approx(0.9 * LR)  # the boundary
    hp = {"lr_schedule": "inv_step", "lr_inv_gamma": 0.05, "lr_inv_power": 0.75}
    assert [LR * lr_factor(hp, t, None) for t in range(30)] == pytest.approx(
        release_inverse_lrs(30, 0.05, 0.75), rel=1e-9)
    hp = {"lr_schedule": "inv_epoch", "lr_inv_gamma": 0.5, "lr_inv_power": 2.0}
    # a fractional epoch (DomainBed's: 13 items / batch 4 = 3.25 steps): epochs start at steps
    # 0, 4 (3.25), 7 (6.5), 10 (9.75), 13
    assert [lr_factor(hp, s, 3.25) for s in (0, 3, 4, 6, 7, 9, 10, 13)] == pytest.approx(
        [1, 1, 1.5 ** -2, 1.5 ** -2, 2.0 ** -2, 2.0 ** -2, 2.5 ** -2, 3.0 ** -2])
    assert lr_factor({"lr_schedule": "constant"}, 10 ** 6, None) == 1.0
    with pytest.raises(ValueError, match="counts epochs.*not known"):
        lr_factor({"lr_schedule": "exp_epoch", "lr_decay": 0.9}, 3, None)


@pytest.fixture
def lrs_per_step(monkeypatch):
    """Every optimizer's param-group lrs that each update of an in-process job ran with."""
    seen = []
    update = loop.Job.update

    def recording(self):
        seen.append({name: [g["lr"] for g in opt.param_groups]
                     for name, opt in self.algorithm.optimizers().items()})
        return update(self)

    monkeypatch.setattr(loop.Job, "update", recording)
    return seen


def run_job(out, hparams, *extra, steps=16, algorithm="DMG"):
    args = build_parser().parse_args([
        "--dataset", "Debug28", "--algorithm", algorithm, "--test_envs", "0", "--steps",
        str(steps), "--checkpoint_freq", "5", "--output_dir", str(out), "--hparams",
        json.dumps({"batch_size": 4, "mnist_cnn_width": 16, **hparams}), *extra])
    return train.run(args)


def test_exp_epoch_decays_the_network_per_pooled_epoch_and_leaves_the_masks(tmp_path,
                                                                           lrs_per_step):
    """The PACS release: pooled batches of 4 from 26 source items (7 steps an epoch), the
    network's lr x 0.5 per epoch, the mask optimizer's lr constant."""
    assert run_job(tmp_path, {"batch_sampling": "pooled", "lr_schedule": "exp_epoch",
                              "lr_decay": 0.5}) == "done"
    expected = release_exponential_lrs(16, 7, 0.5)
    assert [lrs["optimizer"] for lrs in lrs_per_step] == [[lr] for lr in expected]
    assert [lrs["mask_optimizer"] for lrs in lrs_per_step] == [[LR]] * 16
    assert read_records(tmp_path)[-1]["epoch"] == 15 / 7


def test_inv_step_moves_the_masks_too_with_dmg_mask_lr_schedule(tmp_path, lrs_per_step):
    """The DomainNet release: both optimizers follow InvLR, stepped every iteration."""
    hp = {"lr_schedule": "inv_step", "lr_inv_gamma": 0.1, "lr_inv_power": 0.75,
          "dmg_mask_lr_schedule": True, "dmg_mask_lr": 2e-3}
    assert run_job(tmp_path, hp, steps=8) == "done"
    expected = release_inverse_lrs(8, 0.1, 0.75)
    assert [lrs["optimizer"][0] for lrs in lrs_per_step] == pytest.approx(expected, rel=1e-9)
    assert [lrs["mask_optimizer"][0] for lrs in lrs_per_step] == pytest.approx(
        [2 * lr for lr in expected], rel=1e-9)


def test_inv_epoch_uses_domainbeds_epoch_with_per_domain_batches(tmp_path, lrs_per_step):
    """ERM, per-domain batches of 4: DomainBed's epoch is the smallest in-split (13) / 4."""
    hp = {"lr_schedule": "inv_epoch", "lr_inv_gamma": 0.5, "lr_inv_power": 2.0}
    assert run_job(tmp_path, hp, steps=11, algorithm="ERM") == "done"
    expected = [LR * lr_factor(hp, step, 13 / 4) for step in range(11)]
    assert [lrs["optimizer"][0] for lrs in lrs_per_step] == expected
    assert expected[3] == LR and expected[4:11:6] == pytest.approx([LR / 1.5 ** 2, LR / 2.5 ** 2])


def test_a_resume_across_an_epoch_boundary_writes_the_uninterrupted_records(tmp_path,
                                                                           lrs_per_step):
    hp = {"batch_sampling": "pooled", "lr_schedule": "exp_epoch", "lr_decay": 0.5}
    assert run_job(tmp_path / "full", hp) == "done"
    uninterrupted = list(lrs_per_step)
    # stopped after the record of step 5, before the epoch boundary at step 7: the resume
    # crosses it
    args = build_parser().parse_args([
        "--dataset", "Debug28", "--algorithm", "DMG", "--test_envs", "0", "--steps", "16",
        "--checkpoint_freq", "5", "--output_dir", str(tmp_path / "cut"), "--hparams",
        json.dumps({"batch_size": 4, "mnist_cnn_width": 16, **hp})])
    assert train.run(args, stop_after_step=5) == "stopped"
    args.resume = True
    lrs_per_step.clear()
    assert train.run(args) == "done"
    assert lrs_per_step == uninterrupted[6:]  # the resumed steps ran with the same lrs
    drop = ("step_time", "mem_gb", "args")
    assert read_records(tmp_path / "cut", drop=drop) == read_records(tmp_path / "full",
                                                                      drop=drop)


def test_an_algorithm_with_its_own_lr_scheduler_refuses_a_job_schedule():
    cls = ALGORITHMS.get("ToyTwoHeads")
    algorithm = cls((3, 28, 28), 2, 2, tiny_hparams("ToyTwoHeads", "Debug28"))
    with pytest.raises(ValueError, match=r"schedules the lr of opts\.main itself.*schedule\)"
                                         ".*lr_schedule must stay 'constant'"):
        algorithm.set_lr_factor(0.5)
