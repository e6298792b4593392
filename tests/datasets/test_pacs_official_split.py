"""PACS's ``data_split`` "official": the official split lists (``<domain>_{train,crossval,test}_kfold
.txt``) through ``PACS.predefined_split``, on a generated PACS tree with generated lists."""

import shutil

import pytest
import torch

from dg_plugins import hparams
from dg_plugins.datasets.image_folder import PACS, PACS_SPLITS_URL, OfficialSplitError
from support.image_tree import make_pacs_tree, write_pacs_split_lists

OFFICIAL = {"data_augmentation": True, "data_split": "official"}


@pytest.fixture(scope="module")
def pacs_root(tmp_path_factory):
    root = make_pacs_tree(tmp_path_factory.mktemp("pacs_official"), per_class=3, size=32)
    lists = write_pacs_split_lists(root)
    return root, lists


def listed(env, indices):
    paths = env.relative_paths()
    return [paths[i] for i in indices]


def test_default_split_is_domainbeds_random_holdout(pacs_root):
    root, _ = pacs_root
    dataset = PACS(str(root), [0], {"data_augmentation": True})
    assert dataset.data_split == "domainbed"
    assert all(dataset.predefined_split(i) is None for i in range(4))


def test_sources_train_and_crossval_target_test_and_crossval(pacs_root):
    root, lists = pacs_root
    dataset = PACS(str(root), [3], OFFICIAL)
    for index, folder in enumerate(dataset.environment_folders):
        env = dataset.datasets[index]
        in_, out = dataset.predefined_split(index)
        in_kind = "test" if index == 3 else "train"
        # in/out are the listed images, in the lists' order
        assert listed(env, in_) == lists[folder][in_kind]
        assert listed(env, out) == lists[folder]["crossval"]
    # the target's in split is every image of the domain (the release's target test set)
    target_in, target_out = dataset.predefined_split(3)
    assert sorted(target_in) == list(range(len(dataset.datasets[3])))
    assert set(target_out) < set(target_in)
    # a source's in and out are disjoint and cover the domain
    source_in, source_out = dataset.predefined_split(0)
    assert not set(source_in) & set(source_out)
    assert sorted(source_in + source_out) == list(range(len(dataset.datasets[0])))
    # another target: its lists change, the others' stay
    other = PACS(str(root), [0], OFFICIAL)
    assert listed(other.datasets[0], other.predefined_split(0)[0]) == lists["art_painting"]["test"]
    assert other.predefined_split(3)[0] != dataset.predefined_split(3)[0]
    assert other.predefined_split(1) == dataset.predefined_split(1)


def test_validation_items_are_not_augmented_training_items_are(pacs_root):
    root, _ = pacs_root
    dataset = PACS(str(root), [3], OFFICIAL)
    env = dataset.datasets[0]
    in_, out = dataset.predefined_split(0)
    plain = env.with_transform(dataset.plain_transform)
    torch.manual_seed(0)
    out_first, in_first = env[out[0]][0], env[in_[0]][0]
    torch.manual_seed(1)
    out_second, in_second = env[out[0]][0], env[in_[0]][0]
    assert torch.equal(out_first, out_second) and torch.equal(out_first, plain[out[0]][0])
    assert not torch.equal(in_first, in_second)  # DomainBed's augmentation on the training items
    # the random split keeps DomainBed's behaviour: every item of a source is augmented
    random_split = PACS(str(root), [3], {"data_augmentation": True})
    assert random_split.datasets[0].eval_indices == frozenset()


def test_list_paths_match_from_the_domain_folder_on_and_duplicates_count_twice(tmp_path):
    root = make_pacs_tree(tmp_path, per_class=2, size=32)
    lists = write_pacs_split_lists(root, prefix="/data/pacs_data/")
    folder = root / "PACS"
    crossval = folder / "cartoon_crossval_kfold.txt"
    first = crossval.read_text().splitlines()[0]
    crossval.write_text(crossval.read_text() + first + "\n")  # the official lists repeat a few
    dataset = PACS(str(root), [0], OFFICIAL)
    _, out = dataset.predefined_split(1)
    assert listed(dataset.datasets[1], out) == lists["cartoon"]["crossval"] + [
        lists["cartoon"]["crossval"][0]]


def test_missing_lists_name_the_files_the_folder_and_the_source(tmp_path):
    root = make_pacs_tree(tmp_path, per_class=2, size=32)
    write_pacs_split_lists(root)
    (root / "PACS" / "sketch_test_kfold.txt").unlink()
    (root / "PACS" / "photo_crossval_kfold.txt").unlink()
    with pytest.raises(OfficialSplitError) as err:
        PACS(str(root), [3], OFFICIAL)
    message = str(err.value)
    assert "sketch_test_kfold.txt" in message and "photo_crossval_kfold.txt" in message
    assert str(root / "PACS") in message and PACS_SPLITS_URL in message
    assert "pacs_label" in message and "data_split 'domainbed'" in message
    assert (f"python -m dg_plugins.scripts.download --data_dir {root} PACS_splits downloads "
            "them") in message
    PACS(str(root), [2], {"data_augmentation": True})  # the default split needs no list
    with pytest.raises(FileNotFoundError):  # an OfficialSplitError is a FileNotFoundError
        PACS(str(root), [3], OFFICIAL)


def test_lines_that_match_no_image_or_the_wrong_class_are_refused(tmp_path):
    root = make_pacs_tree(tmp_path, per_class=2, size=32)
    write_pacs_split_lists(root)
    train = root / "PACS" / "photo_train_kfold.txt"
    good = train.read_text()
    train.write_text(good + "photo/dog/not_there.jpg 1\n")
    with pytest.raises(OfficialSplitError, match=r"1 of the \d+ lines of .*photo_train_kfold.txt "
                                                 r"name no image of .*line \d+: photo/dog/"
                                                 r"not_there.jpg"):
        PACS(str(root), [0], OFFICIAL)
    path, label = good.splitlines()[0].split()
    train.write_text(good.replace(f"{path} {label}\n", f"{path} {int(label) % 7 + 1}\n", 1))
    with pytest.raises(OfficialSplitError, match=r"disagree with the class folders.*has label"
                       ) as err:
        PACS(str(root), [0], OFFICIAL)
    assert isinstance(err.value, ValueError)  # bad input data: train reports it as one line


def test_the_hparam_is_declared_for_pacs_only_and_checked(tmp_path):
    assert hparams.default_hparams("ERM", "PACS")["data_split"] == "domainbed"
    assert "data_split" not in hparams.default_hparams("ERM", "VLCS")
    assert hparams.validate("DMG", "PACS", {"data_split": "official"}) == {
        "data_split": "official"}
    with pytest.raises(hparams.HparamError, match="must be one of 'domainbed', 'official'"):
        hparams.validate("ERM", "PACS", {"data_split": "kfold"})
    root = make_pacs_tree(tmp_path, per_class=1, size=32)
    with pytest.raises(ValueError, match="unknown data_split 'kfold'; choices: domainbed, "
                                         "official"):
        PACS(str(root), [0], {"data_split": "kfold"})
    shutil.rmtree(root)
