"""train's opt-in compute settings (dg_plugins.train.compute): ``--precision bf16`` trains and
evaluates under autocast, records itself and resumes exactly; every registered algorithm runs a
bf16 step and predicts under autocast; fp16's gradient scaler goes through optimizer_step (every
built-in algorithm's steps) and the resume file; fp16 is refused on a CPU with its fix;
``--channels_last`` and ``--deterministic false`` do what they say; sweep, reproduce and
collect_results pass them on and show them."""

import copy
import json
import shlex
import shutil
import signal
import time

import pytest
import torch
import torch.nn as nn

import dg_plugins.algorithms  # noqa: F401  (registers)
import dg_plugins.datasets  # noqa: F401
from dg_plugins.algorithms.base import GradScalingError, gradient_scaling, guard_scaled_steps
from dg_plugins.job.flags import record_args
from dg_plugins.registry import ALGORITHMS, DATASETS
from dg_plugins.scripts.train import build_parser, main
from dg_plugins.train import loop as job_lib
from dg_plugins.train import compute
from dg_plugins.train import run as train
from dg_plugins.train.compute import FP16_FIX, Compute
from support.helpers import TEST_PLUGIN_MODULES, read_records, tiny_hparams
from support.job_gate import gate_env, released
from support.processes import command_env, finish, run, start

#: Built-in algorithms and the test-only plugins (as tests/algorithms/test_all_algorithms.py).
NAMES = [n for n, cls in ALGORITHMS.items()
         if cls.__module__.startswith("dg_plugins.") or cls.__module__ in TEST_PLUGIN_MODULES]
CPU = torch.device("cpu")
#: A short RotatedMNIST5k job (built-in data, the loader a user gets) that learns in bf16, with
#: records at its first and last step only (``--checkpoint_freq`` past its steps: an evaluation
#: costs some steps of emulated bf16 on a CPU without bfloat16 instructions) and the dataset's CNN
#: at half its default width (hparam ``mnist_cnn_width`` 16: a quarter of the emulated work).
#: Its thresholds below (mean training-domain accuracy > 0.18, and 0.08 above the first record's),
#: run in bf16 with --seed 0 to 5 on the 2-core AVX2 EPYC: cleared by at least 0.118 and 0.086
#: (last 0.30-0.41, first 0.09-0.18), the loss falling each time.
LEARN_STEPS = 36
LEARN = ["--dataset", "RotatedMNIST5k", "--steps", str(LEARN_STEPS), "--checkpoint_freq",
         str(LEARN_STEPS), "--hparams", '{"batch_size": 32, "mnist_cnn_width": 16, "lr": 0.005}',
         "--test_envs", "0", "--eval_splits", "selection"]
#: The Debug28 jobs of the resume check: a 16-wide CNN (the default 128 makes each such job some
#: 15 CPU-s of emulated bf16).
SMALL = ["--dataset", "Debug28", "--steps", "6", "--checkpoint_freq", "2", "--hparams",
         '{"batch_size": 8, "mnist_cnn_width": 16}', "--test_envs", "0", "--eval_splits",
         "selection"]


def without_volatile(records):
    """Records minus wall-clock keys and the output folder (which differs between two runs)."""
    return [{k: ({**v, "output_dir": None} if k == "args" else v) for k, v in r.items()
             if k not in ("step_time", "mem_gb")} for r in records]


def test_bf16_job_learns_records_its_precision_and_resumes_exactly(tmp_path, capsys):
    """train in bf16: accuracy rises above chance and every record says bf16 (RotatedMNIST5k, a
    16-wide CNN, records at its first and last step only; run in this process); a run killed
    after step 3 and resumed writes the records of the uninterrupted run, and a resume without
    the flag is refused (Debug28 with a 16-wide CNN, which learns nothing but costs little: bf16
    is emulated, slow, on a CPU without bfloat16 instructions; the reference and the refusal run
    in this process, the killed run and its resume as the real command). The records evaluate
    the splits model selection reads (``--eval_splits selection``)."""
    assert main([*LEARN, "--precision", "bf16", "--output_dir", str(tmp_path / "learn")]) == 0
    records = read_records(tmp_path / "learn")
    assert [r["step"] for r in records] == [0, LEARN_STEPS - 1]
    assert all(r["args"]["precision"] == "bf16" for r in records)
    assert not {"channels_last", "deterministic"} & set(records[0]["args"])
    train_out = [f"env{i}_out_acc" for i in range(1, 6)]
    first, last = (sum(r[k] for k in train_out) / 5 for r in (records[0], records[-1]))
    assert last > 0.18 and last > first + 0.08, (first, last)  # 10 classes: chance is 0.1
    assert records[-1]["loss"] < records[0]["loss"]

    small = SMALL
    full, cut, gate = tmp_path / "full", tmp_path / "cut", tmp_path / "gate"
    gate.mkdir()
    assert main([*small, "--precision", "bf16", "--output_dir", str(full)]) == 0
    proc = start("dg_plugins.scripts.train", *small, "--precision", "bf16", "--output_dir", cut,
                 env=gate_env(gate, step=3))
    with released(gate):
        while not (gate / "waiting").exists():
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        finish(proc, timeout=60)
    assert len(read_records(cut)) == 2  # steps 0 and 2; the checkpoint continues at step 3
    capsys.readouterr()
    assert main([*small, "--output_dir", str(cut), "--resume"]) == 2
    out = "".join(capsys.readouterr())  # the job's output (stdout) and stderr
    assert "--precision: 'bf16' in the checkpoint, 'fp32' now (the default)" in out, out[-3000:]
    code, out = run("dg_plugins.scripts.train", *small, "--precision", "bf16", "--output_dir",
                    cut, "--resume", env=command_env(), timeout=600)
    assert code == 0, out[-3000:]
    records = read_records(full)
    assert all(r["args"]["precision"] == "bf16" for r in records)
    assert without_volatile(read_records(cut)) == without_volatile(records)


def test_fp16_on_a_cpu_is_refused_with_the_fix(tmp_path, capsys):
    out = tmp_path / "job"
    assert main(["--dataset", "Debug28", "--precision", "fp16", "--device", "cpu",
                 "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--precision fp16 is for CUDA devices" in err[0]
    assert "use --precision bf16" in err[0]
    assert not out.exists()  # refused before anything is written


def test_cpu_features_are_read_from_the_x86_and_the_arm_line(tmp_path):
    x86, arm = tmp_path / "x86", tmp_path / "arm"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t: x\n")
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd bf16 i8mm\n")
    assert compute.cpu_features(str(x86)) == {"fpu", "avx2", "fma"}  # the first CPU's
    assert compute.cpu_features(str(arm)) == {"fp", "asimd", "bf16", "i8mm"}
    assert compute.cpu_features(str(tmp_path / "none")) is None  # not Linux: unknown


@pytest.mark.parametrize("features, native", [({"avx2", "fma"}, False), ({"avx512_bf16"}, True),
                                              ({"asimd", "bf16"}, True), (None, None)])
def test_only_bf16_on_a_cpu_without_bfloat16_instructions_gets_a_note(monkeypatch, features,
                                                                      native):
    """torch emulates bfloat16 on such a CPU (a step 10x fp32's on a 2-core AVX2 EPYC): the job
    says so. A CPU with them, one whose features are unknown, fp32, and a GPU get no note."""
    monkeypatch.setattr(compute, "cpu_features",
                        lambda path=None: None if features is None else frozenset(features))
    assert compute.native_cpu_bf16() is native
    note = Compute("bf16").device_note(CPU)
    assert (note is not None) == (native is False)
    assert note is None or "no bfloat16 instructions" in note and "--precision fp32" in note
    assert Compute("fp32").device_note(CPU) is None
    assert Compute("bf16").device_note(torch.device("cuda")) is None


def test_default_values_given_explicitly_are_the_default_job(tmp_path):
    """``--precision fp32 --channels_last false --deterministic true`` is the job without flags:
    nothing enters its args (records, sweep folder hash)."""
    explicit = build_parser().parse_args(["--precision", "fp32", "--channels_last", "false",
                                          "--deterministic", "true"])
    assert record_args(explicit) == record_args(
        build_parser().parse_args([]))
    given = build_parser().parse_args(["--precision", "bf16", "--channels_last",
                                       "--deterministic", "false"])
    assert {k: record_args(given)[k]
            for k in ("precision", "channels_last", "deterministic")} == {
        "precision": "bf16", "channels_last": True, "deterministic": False}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--deterministic", "maybe"])


# --------------------------------------------------------------------------------------------------
# Every algorithm


def build(name, dataset="Debug28", num_domains=2, **overrides):
    """``name`` with CPU-sized hparams on ``dataset``; on Debug28 its CNN 16 wide (the default
    128 makes a bf16 step, emulated on a CPU without bfloat16 instructions, costly)."""
    torch.manual_seed(0)
    if dataset == "Debug28":
        overrides.setdefault("mnist_cnn_width", 16)
    data = DATASETS.get(dataset)("", [], {})
    hp = tiny_hparams(name, dataset, **overrides)
    return ALGORITHMS.get(name)(data.input_shape, data.num_classes, num_domains, hp), data


def minibatches(data, envs=(0, 1), batch=8):
    out = []
    for i in envs:
        items = [data[i][j % len(data[i])] for j in range(batch)]
        out.append((torch.stack([x for x, _ in items]), torch.as_tensor([y for _, y in items])))
    return out


def output_dtypes(model):
    """Record the output dtype of every Linear and Conv2d of ``model`` (a list, and the hooks)."""
    seen = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
             for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    return seen, hooks


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_runs_a_reduced_precision_step_and_predicts_under_autocast(name,
                                                                                   precision):
    """One ``update`` as Job.train_step runs it: under autocast, and for fp16 with the gradient
    scaler and the guard (CPU autocast here: train refuses fp16 off CUDA, but the float16 path
    is the same). Its layers compute in the reduced dtype, the parameters stay float32, finite,
    and change, the values keep the fp32 step's keys; ``predict`` runs in that dtype too (as
    evaluation runs it). fp16 refuses an algorithm that steps an optimizer outside
    optimizer_step (the test-only ToyTwoHeads), with one line."""
    algorithm, data = build(name)
    reference = copy.deepcopy(algorithm)
    # float16 on a CPU runs reference kernels, ~10x bfloat16's time: 2 images per domain there
    batches = minibatches(data, batch=2 if precision == "fp16" else 8)
    fp32_values = reference.update(batches, None)
    before = {n: p.detach().clone() for n, p in algorithm.named_parameters()}
    compute = Compute(precision=precision)
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    if scaler is not None:
        guard_scaled_steps(algorithm, fix=FP16_FIX)
    seen, hooks = output_dtypes(algorithm)
    with compute.active(), compute.autocast(CPU), gradient_scaling(scaler):
        try:
            values = algorithm.update(batches, None)
        except GradScalingError as err:
            assert precision == "fp16" and name == "ToyTwoHeads", err
            assert f"{name} steps an optimizer" in str(err) and "--precision bf16" in str(err)
            assert "\n" not in str(err)
            return
    assert not (precision == "fp16" and name == "ToyTwoHeads"), "its own steps were not refused"
    assert compute.dtype in seen, f"{name}'s update ran no layer in {precision}"
    assert set(values) == set(fp32_values)
    assert all(isinstance(v, float) for v in values.values())
    for n, p in algorithm.named_parameters():
        assert p.dtype == torch.float32 and torch.isfinite(p).all(), n
    assert any(not torch.equal(p, before[n]) for n, p in algorithm.named_parameters())
    seen.clear()
    algorithm.eval()
    with torch.no_grad(), compute.autocast(CPU):
        logits = algorithm.predict(batches[0][0])
    for hook in hooks:
        hook.remove()
    assert compute.dtype in seen and logits.shape == (len(batches[0][0]), data.num_classes)
    assert torch.isfinite(logits.float()).all()


def test_mpbm_keeps_its_statistics_and_its_fp16_queries_in_float32():
    """MPBM's feature statistics are float32 sums whatever the autocast; its SGLD input
    gradients run in float32 under fp16 (the scaler does not cover them), in bf16 under bf16."""
    algorithm, data = build("MPBM")
    (x, y), = minibatches(data, envs=(0,))
    features = torch.randn(16, algorithm.featurizer.n_outputs)
    twin = copy.deepcopy(algorithm)
    twin.accumulate_features(features)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        algorithm.accumulate_features(features)
    assert torch.equal(algorithm.feat_m2, twin.feat_m2) and algorithm.feat_m2.abs().sum() > 0
    for dtype, want in ((torch.float16, {torch.float32}), (torch.bfloat16, {torch.bfloat16})):
        seen, hooks = output_dtypes(algorithm.network)
        with torch.autocast("cpu", dtype=dtype):
            algorithm.sgld_queries(x, y)
        for hook in hooks:
            hook.remove()
        assert set(seen) == want and len(seen) > 0


class CountingScaler(torch.amp.GradScaler):
    """A gradient scaler that keeps the optimizers it stepped."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stepped = []

    def step(self, optimizer, *args, **kwargs):
        self.stepped.append(optimizer)
        return super().step(optimizer, *args, **kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_fp16_gradient_scaler_covers_every_optimizer_step(name):
    """fp16's scaler (on CPU here: the route, not the dtype) at an infinite scale, which makes
    every gradient non-finite: an algorithm whose steps all go through optimizer_step changes no
    parameter (the scaler skipped each of its steps); one that steps outside it is refused with
    one line naming it and the precision that works. Every built-in algorithm is covered."""
    algorithm, data = build(name)
    guard_scaled_steps(algorithm, fix=FP16_FIX)
    before = {n: p.detach().clone() for n, p in algorithm.named_parameters()}
    scaler = CountingScaler("cpu", init_scale=float("inf"))
    with gradient_scaling(scaler):
        try:
            algorithm.update(minibatches(data), None)
        except GradScalingError as err:
            assert not type(algorithm).__module__.startswith("dg_plugins."), err
            assert f"{name} steps an optimizer" in str(err) and "--precision bf16" in str(err)
            assert "\n" not in str(err)
            return
    with_gradients = [opt for opt in algorithm.optimizers().values()
                      if any(p.grad is not None for g in opt.param_groups for p in g["params"])]
    assert with_gradients and set(map(id, scaler.stepped)) == set(map(id, with_gradients))
    if name == "DMG":  # its masks have their own optimizer
        assert algorithm.mask_optimizer in with_gradients
    assert all(torch.equal(p, before[n]) for n, p in algorithm.named_parameters())


def test_gradient_scaler_unscales_before_the_step():
    """Under a scale that does not overflow, a scaled ERM step equals the plain one (scaling by a
    power of two and back is exact in float32)."""
    plain, data = build("ERM")
    scaled = copy.deepcopy(plain)
    batches = minibatches(data)
    plain.update(batches, None)
    with gradient_scaling(torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)):
        scaled.update(batches, None)
    for (n, p), q in zip(plain.named_parameters(), scaled.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-7), n


def test_the_scalers_state_is_resumed(tmp_path, monkeypatch):
    """A job with a gradient scaler (made on CPU by patching the fp16 rule: the resume file is
    the same on any device) saves the scaler with its checkpoint: an interrupted and resumed run
    continues the uninterrupted run's scale, step by step, and writes its records."""
    monkeypatch.setattr(Compute, "make_scaler", lambda self, device: torch.amp.GradScaler(
        "cpu", init_scale=2.0 ** 8, growth_interval=1))
    scales = []
    monkeypatch.setattr(job_lib, "STEP_HOOKS",
                        [lambda job, step: scales.append((step, job.scaler.get_scale()))])
    argv = ["--dataset", "Debug28", "--hparams", '{"batch_size": 8, "mnist_cnn_width": 16}',
            "--steps", "9", "--checkpoint_freq", "3"]
    assert train.run(build_parser().parse_args(argv + ["--output_dir", str(tmp_path / "a")])) \
        == "done"
    full, scales[:] = list(scales), []
    cut = argv + ["--output_dir", str(tmp_path / "b")]
    assert train.run(build_parser().parse_args(cut), stop_after_step=3) == "stopped"
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["grad_scaler"][
        "scale"] == 2.0 ** 12
    assert train.run(build_parser().parse_args(cut + ["--resume"])) == "done"
    assert scales == full and full[-1][1] == 2.0 ** 17
    assert without_volatile(read_records(tmp_path / "b")) == without_volatile(
        read_records(tmp_path / "a"))


# --------------------------------------------------------------------------------------------------
# channels_last, deterministic


def first_conv_input_formats(model):
    """Whether each input of ``model``'s first Conv2d was channels_last (a list, and the hook)."""
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    formats = []
    hook = conv.register_forward_pre_hook(lambda _m, args: formats.append(
        args[0].is_contiguous(memory_format=torch.channels_last)
        and not args[0].is_contiguous()))
    return formats, hook


@pytest.mark.parametrize("dataset,overrides", [("Debug28", {}),
                                               ("Debug224", {"resnet18": True})])
def test_channels_last_feeds_the_convolutions_channels_last_with_the_same_predictions(
        dataset, overrides):
    """The MNIST CNN and a ResNet-18: after prepare_model the weights and the first conv's input
    are channels_last, and the predictions equal the default format's up to rounding."""
    default, data = build("ERM", dataset, **overrides)
    default.eval()
    model = copy.deepcopy(default)
    compute = Compute(channels_last=True)
    compute.prepare_model(model)
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = minibatches(data, envs=(0,), batch=4)[0][0]
    formats, hook = first_conv_input_formats(model)
    with torch.no_grad():
        got = model.predict(compute.model_input(x))
        want = default.predict(x)
    hook.remove()
    assert formats == [True]
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_channels_last_leaves_a_vit_alone_with_a_note(capsys):
    model, _ = build("ERM_ViT", "Debug224")
    compute = Compute(channels_last=True)
    compute.prepare_model(model)
    assert "stays in the default memory format" in capsys.readouterr().out
    x = torch.zeros(2, 3, 224, 224)
    assert not compute.inputs_channels_last and compute.model_input(x) is x


def test_a_job_applies_its_settings_in_training_and_evaluation(tmp_path, monkeypatch, capsys):
    """A train job with all three: its steps and its evaluation's predictions run under bf16
    autocast on channels_last batches, its convs are channels_last, the deterministic
    algorithms are off and cudnn.benchmark on while it trains; every record's args hold the
    three settings. On a CPU without bfloat16 instructions its output says so."""
    monkeypatch.setattr(compute, "cpu_features", lambda path=None: frozenset({"avx2"}))
    erm = ALGORITHMS.get("ERM")
    calls = {"update": [], "predict": []}

    def state(x):
        return (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"),
                x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())

    def update(self, minibatches, unlabeled=None):
        calls["update"].append(state(minibatches[0][0]))
        return real_update(self, minibatches, unlabeled)

    def predict(self, x):
        calls["predict"].append(state(x))
        return real_predict(self, x)

    real_update, real_predict = erm.update, erm.predict
    monkeypatch.setattr(erm, "update", update)
    monkeypatch.setattr(erm, "predict", predict)
    seen = []

    def look(job, step):
        conv = next(m for m in job.algorithm.modules() if isinstance(m, nn.Conv2d))
        seen.append((conv.weight.is_contiguous(memory_format=torch.channels_last),
                     torch.are_deterministic_algorithms_enabled(),
                     torch.backends.cudnn.benchmark))

    monkeypatch.setattr(job_lib, "STEP_HOOKS", [look])
    args = build_parser().parse_args(["--dataset", "Debug28", "--hparams",
                                      '{"batch_size": 8, "mnist_cnn_width": 16}',
                                      "--steps", "3", "--precision", "bf16", "--channels_last",
                                      "--deterministic", "false", "--device", "cpu",
                                      "--output_dir", str(tmp_path)])
    try:
        assert train.run(args) == "done"
    finally:
        Compute().configure_backends()
    assert seen == [(True, False, True)] * 3
    assert Compute("bf16").device_note(CPU) in capsys.readouterr().out.splitlines()
    assert calls["update"] == [(torch.bfloat16, True)] * 3
    assert calls["predict"] and set(calls["predict"]) == {(torch.bfloat16, True)}
    for record in read_records(tmp_path):
        assert {k: record["args"].get(k) for k in ("precision", "channels_last",
                                                    "deterministic")} == {
            "precision": "bf16", "channels_last": True, "deterministic": False}


# --------------------------------------------------------------------------------------------------
# sweep, reproduce, UDG, collect_results


def test_sweep_passes_the_settings_to_every_job_and_hashes_only_other_values(tmp_path):
    from dg_plugins.sweep import cli as sweep_cli

    def sweep_jobs(*flags):
        return sweep_cli.sweep_jobs(["launch", "--datasets", "Debug28", "--algorithms", "ERM",
                                     "--n_trials", "1", "--n_hparams", "1", "--data_dir", "d",
                                     "--output_dir", str(tmp_path), *flags], dry_run=True)[1]

    default = sweep_jobs()
    explicit = sweep_jobs("--precision", "fp32", "--channels_last", "false",
                          "--deterministic", "true")
    assert [j.command_str for j in explicit] == [j.command_str for j in default]
    assert "--precision" not in default[0].command_str.split()
    fast = sweep_jobs("--precision", "bf16", "--channels_last", "--deterministic", "false")
    assert {j.output_dir for j in fast}.isdisjoint(j.output_dir for j in default)
    command = shlex.split(fast[0].command_str)
    assert command[1:3] == ["-m", "dg_plugins.scripts.train"]
    parsed = build_parser().parse_args(command[3:])
    assert (parsed.precision, parsed.channels_last, parsed.deterministic) == ("bf16", True, False)


def test_reproduce_passes_the_settings_as_sweep_flags():
    from dg_plugins import reproduce

    reproduce.check_extra(["--precision", "bf16", "--channels_last", "--deterministic", "false"])
    with pytest.raises(reproduce.UsageError):  # a protocol flag still is refused
        reproduce.check_extra(["--steps", "5"])


def test_udg_pretraining_identity_holds_settings_not_at_their_defaults():
    from dg_plugins.train.udg import pretrain_identity

    args = build_parser().parse_args(["--label_fraction", "0.1"])
    plain = pretrain_identity(args, {}, 10)
    assert not {"precision", "channels_last", "deterministic"} & set(plain)
    args = build_parser().parse_args(["--label_fraction", "0.1", "--precision", "bf16"])
    assert pretrain_identity(args, {}, 10) == {**plain, "precision": "bf16"}


def test_collect_results_notes_runs_with_other_compute_settings(shared_fixtures, tmp_path,
                                                                capsys):
    """Tables unchanged (stdout stays DomainBed's); a note on stderr counts the runs per
    setting, then the defaults of every compute flag (the flag table's); none for a sweep at
    the defaults."""
    from dg_plugins.scripts import collect_results

    sweep = tmp_path / "sweep"
    shutil.copytree(shared_fixtures / "domainbed_sweep_data", sweep)
    assert collect_results.main(["--input_dir", str(sweep)]) == 0
    plain_out, plain_err = capsys.readouterr()
    assert "Compute settings" not in plain_err
    folders = sorted(p for p in sweep.iterdir() if (p / "results.jsonl").exists())
    for k, folder in enumerate(folders[:3]):
        path = folder / "results.jsonl"
        settings = {"precision": "bf16", **({"channels_last": True} if k == 0 else {})}
        path.write_text("".join(json.dumps({**r, "args": {**r["args"], **settings}}) + "\n"
                                for r in map(json.loads, path.read_text().splitlines())))
    assert collect_results.main(["--input_dir", str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert out == plain_out
    assert (f"Compute settings: of the {len(folders)} runs (job folders) read, 2 used "
            "--precision bf16; 1 used --precision bf16 --channels_last true; "
            f"{len(folders) - 3} the defaults (--precision fp32, --channels_last false, "
            "--deterministic true, --augment_on loader)") in " ".join(err.split())
