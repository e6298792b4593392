"""Plugin modules as users name them in ``$DG_PLUGINS_IMPORT``: a module that does not import is
one line naming the variable, the module and the fix, for every command that loads plugins."""

import os
import subprocess
import sys

import pytest


def command(tmp_path, script, *argv, plugins, path=()):
    env = dict(os.environ, DG_PLUGINS_IMPORT=plugins,
               PYTHONPATH=os.pathsep.join([*map(str, path), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", f"dg_plugins.scripts.{script}", *argv],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.mark.parametrize("script", ["train", "check_data"])
def test_a_plugin_module_that_is_not_found_is_one_line_with_the_fix(tmp_path, script):
    out = tmp_path / "job"
    argv = (["--dataset", "Debug28", "--output_dir", str(out)] if script == "train"
            else ["--dataset", "PACS", "--data_dir", str(tmp_path)])
    done = command(tmp_path, script, *argv, plugins="my_featalign_plugin")
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
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
