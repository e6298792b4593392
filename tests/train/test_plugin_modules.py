"""Plugin modules as users name them in ``$DG_PLUGINS_IMPORT``: a module that does not import is
one line naming the variable, the module and the fix, for every command that loads plugins; the
Algorithm contract runs on a user's module (``python -m dg_plugins.scripts.check_algorithm``,
``python -m pytest --pyargs dg_plugins.contract``), passing a sound algorithm and failing a
broken one."""

import os
import subprocess
import sys
import textwrap

import pytest

#: A user's plugin module (outside the package) registering one small algorithm; ``{name}`` and
#: ``{logits}`` vary it.
PLUGIN = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from dg_plugins.algorithms import Algorithm, register_algorithm


    @register_algorithm("{name}")
    class {name}(Algorithm):
        def __init__(self, input_shape, num_classes, num_domains, hparams):
            super().__init__(input_shape, num_classes, num_domains, hparams)
            self.net = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                                     nn.Linear(input_shape[0] * 16, num_classes))
            self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)

        def update(self, minibatches, unlabeled=None):
            x = torch.cat([x for x, _ in minibatches])
            y = torch.cat([y for _, y in minibatches])
            loss = F.cross_entropy(self.net(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            return {{"loss": loss.item()}}

        def predict(self, x):
            return {logits}
""")


def command(tmp_path, script, *argv, plugins, path=()):
    env = dict(os.environ, DG_PLUGINS_IMPORT=plugins,
               PYTHONPATH=os.pathsep.join([*map(str, path), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", f"dg_plugins.scripts.{script}", *argv],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.mark.parametrize("script", ["train", "check_data"])
def test_a_plugin_module_that_is_not_found_is_one_line_with_the_fix(tmp_path, script, capsys,
                                                                    monkeypatch):
    """The command's ``main`` in this process (the message is the subject; the real command
    refuses a plugin below)."""
    import importlib

    main = importlib.import_module(f"dg_plugins.scripts.{script}").main
    monkeypatch.setenv("DG_PLUGINS_IMPORT", "my_featalign_plugin")
    out = tmp_path / "job"
    argv = (["--dataset", "Debug28", "--output_dir", str(out)] if script == "train"
            else ["--dataset", "PACS", "--data_dir", str(tmp_path)])
    capsys.readouterr()
    assert main(argv) == 2
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("error: plugin module 'my_featalign_plugin' (named in "
                               "$DG_PLUGINS_IMPORT) cannot be found"), lines[0]
    assert "PYTHONPATH=/path/to/folder" in lines[0]
    assert not out.exists()


def test_a_plugin_whose_own_import_fails_names_the_missing_package(tmp_path):
    (tmp_path / "plugin_needing_a_package.py").write_text("import package_not_installed_xyz\n")
    out = tmp_path / "job"
    done = command(tmp_path, "train", "--dataset", "Debug28", "--output_dir", str(out),
                   plugins="plugin_needing_a_package", path=[tmp_path])
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert lines == ["error: plugin module 'plugin_needing_a_package' (named in "
                     "$DG_PLUGINS_IMPORT) failed to import: No module named "
                     "'package_not_installed_xyz'; install the package that provides "
                     "'package_not_installed_xyz' in this Python"], done.stderr[-3000:]
    assert not out.exists()


def write_plugin(folder, module, name, logits="self.net(x)"):
    (folder / f"{module}.py").write_text(PLUGIN.format(name=name, logits=logits))


def test_the_contract_runs_on_a_plugin_module_outside_the_package(tmp_path):
    """``-k FeatAlign`` on the package's tests selected nothing: the command selects the
    module's algorithm, and only it, and passes it."""
    write_plugin(tmp_path, "my_feat_align", "FeatAlign")
    done = command(tmp_path, "check_algorithm", "my_feat_align", plugins="", path=[tmp_path])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith("The Algorithm contract on FeatAlign (dg_plugins.contract):")
    assert " passed" in done.stdout and "failed" not in done.stdout
    run = subprocess.run(  # the same tests as pytest runs them, listed
        [sys.executable, "-m", "pytest", "--pyargs", "dg_plugins.contract", "--collect-only",
         "-q", "-p", "no:cacheprovider", "-o", "addopts="], capture_output=True, text=True,
        timeout=300, cwd=tmp_path, env=dict(os.environ, DG_PLUGINS_IMPORT="my_feat_align",
                                            PYTHONPATH=str(tmp_path)))
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert ids and all("FeatAlign" in line for line in ids), run.stdout[-3000:]
    assert "test_updates_predict_and_state[FeatAlign-Debug224-cpu]" in run.stdout


def test_the_contract_fails_a_predict_of_the_wrong_shape(tmp_path):
    """Words after ``--`` go to pytest: one case of the contract (Debug224's fails the same
    check) on one device."""
    write_plugin(tmp_path, "my_broken_align", "BrokenAlign", logits="self.net(x)[:, :1]")
    done = command(tmp_path, "check_algorithm", "my_broken_align", "--",
                   "-k", "updates_predict and Debug28 and cpu", plugins="", path=[tmp_path])
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 failed" in done.stdout and "passed" not in done.stdout, done.stdout[-3000:]
    assert "BrokenAlign.predict of 4 images must give logits [4, 2], got [4, 1]" in done.stdout


def test_a_module_without_an_algorithm_is_one_line(tmp_path, capsys, monkeypatch):
    """The command's ``main`` in this process (the message is the subject; the real command
    runs the contract above)."""
    from dg_plugins.scripts.check_algorithm import main

    (tmp_path / "no_algorithm_here.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DG_PLUGINS_IMPORT", "")  # restored after: main adds the module to it
    capsys.readouterr()
    assert main(["no_algorithm_here"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: no_algorithm_here defines no registered algorithm: ")
    assert len(stderr.splitlines()) == 1
