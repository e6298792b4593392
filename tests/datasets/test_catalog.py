"""The torch-free dataset helpers of ``dg_plugins.catalog`` that sweep uses: the dataset-name check
("did you mean", the bridge for DomainBed-only datasets) and ``environments_of`` (the environments
of an image-folder dataset found on disk)."""

import subprocess
import sys

import pytest
from PIL import Image

from dg_plugins import catalog
from support.image_tree import make_pacs_tree


def make_tree(root, layout):
    for domain, classes in layout.items():
        for name, files in classes.items():
            (root / domain / name).mkdir(parents=True, exist_ok=True)
            for file in files:
                Image.new("RGB", (8, 8)).save(root / domain / name / file)
    return root


def test_builtin_datasets_found_without_torch_are_the_registered_ones():
    import dg_plugins.datasets  # noqa: F401  (registers)
    from dg_plugins.datasets.image_folder import MultipleEnvironmentImageFolder
    from dg_plugins.registry import DATASETS

    builtin = {name for name in DATASETS.list()
               if DATASETS.get(name).__module__.startswith("dg_plugins.datasets.")}
    assert set(catalog.BUILTIN_DATASETS) == builtin
    image_folders = {name for name in builtin
                     if issubclass(DATASETS.get(name), MultipleEnvironmentImageFolder)}
    # (other tests may have declared image-folder datasets of their own)
    assert image_folders == {n for n in catalog.IMAGE_FOLDER_DATASETS if n in builtin}
    for name in image_folders:  # the folders the catalog names are the classes' own
        assert DATASETS.get(name).FOLDER_NAME == catalog.IMAGE_FOLDER_DATASETS[name]


def test_dataset_names_implemented_ones_pass():
    for name in ("PACS", "DomainNet", "RotatedMNIST5k", "Debug28", "Digits", "DigitsOffline",
                 "ImageFolder", "DomainNet20", "ColoredMNIST"):
        catalog.check_dataset_name(name)
    catalog.check_dataset_name("MyOwn", extra=["MyOwn"])
    catalog.declare_dataset("DgTestDeclaredData", ["a", "b"])  # a plugin's, at run time
    catalog.check_dataset_name("DgTestDeclaredData")


@pytest.mark.parametrize("name", ["SVIRO", "WILDSCamelyon", "WILDSFMoW", "SpawriousM2M_hard"])
def test_domainbed_only_datasets_point_to_the_bridge(name):
    with pytest.raises(ValueError) as err:
        catalog.check_dataset_name(name)
    assert str(err.value).startswith(
        f"{name} is a DomainBed dataset that dg_plugins does not implement; run it through the "
        "bridge: python -m dg_plugins.scripts.domainbed sweep ...")
    assert "DOMAINBED_ROOT" in str(err.value)


@pytest.mark.parametrize("name, close", [("PAC", "'PACS'"), ("pacs", "'PACS'"),
                                         ("RotatedMNIST5K", "'RotatedMNIST5k'"),
                                         ("Imagefolder", "'ImageFolder'")])
def test_unknown_names_get_did_you_mean_and_the_choices(name, close):
    with pytest.raises(ValueError) as err:
        catalog.check_dataset_name(name)
    message = str(err.value)
    assert message.startswith(f"unknown dataset {name!r}; did you mean {close}")
    assert "(choices: Debug28, Debug224, ColoredMNIST, RotatedMNIST, VLCS, PACS," in message
    assert "SVIRO" not in message.split("choices:")[1]  # DomainBed-only names are no choice


def test_unknown_names_close_to_a_domainbed_only_one_name_the_bridge():
    with pytest.raises(ValueError, match=r"unknown dataset 'Spawrious'; did you mean "
                                         r"'Spawrious.*\(DomainBed's own: run through the bridge"):
        catalog.check_dataset_name("Spawrious")
    with pytest.raises(ValueError, match=r"^unknown dataset 'zzz' \(choices: "):
        catalog.check_dataset_name("zzz")


def test_environments_of_the_generic_image_folder_are_its_domain_folders(tmp_path):
    root = make_tree(tmp_path / "tree", {"photos": {"cat": ["a.jpg"]},
                                         "drawings": {"cat": ["b.png"], "dog": ["c.jpg"]}})
    (root / ".cache").mkdir()  # hidden: not an environment
    assert catalog.environments_of("ImageFolder", str(root)) == ["drawings", "photos"]
    # the same environments as the dataset itself finds
    from dg_plugins.registry import DATASETS

    assert DATASETS.get("ImageFolder")(str(root), [], {}).ENVIRONMENTS == ["drawings", "photos"]


def test_environments_of_named_datasets(tmp_path):
    data_dir = make_pacs_tree(tmp_path, per_class=1, size=16)
    assert catalog.environments_of("PACS", str(data_dir)) == ["A", "C", "P", "S"]
    assert catalog.environments_of("RotatedMNIST5k", None) == ["0", "15", "30", "45", "60", "75"]
    (data_dir / "PACS" / "extra").mkdir()
    with pytest.raises(ValueError, match=r"PACS: .*PACS has 5 domain folders \(art_painting, "
                                         r"cartoon, extra, photo, sketch\) but PACS has 4 "
                                         r"environments"):
        catalog.environments_of("PACS", str(data_dir))
    with pytest.raises(ValueError, match="did you mean 'PACS'"):
        catalog.environments_of("PAC", str(data_dir))
    with pytest.raises(ValueError, match="run it through the bridge"):
        catalog.environments_of("SVIRO", str(data_dir))


def test_environments_of_missing_empty_or_bad_folders_say_what_is_wrong(tmp_path):
    layout = "ImageFolder expects <data_dir>/<domain>/<class>/<image>.jpg"
    with pytest.raises(FileNotFoundError, match=r"no data directory given for ImageFolder "
                                                r"\(pass --data_dir\)"):
        catalog.environments_of("ImageFolder", None)
    with pytest.raises(FileNotFoundError) as err:
        catalog.environments_of("ImageFolder", str(tmp_path / "nowhere"))
    assert f"{tmp_path / 'nowhere'} does not exist" in str(err.value)
    assert layout in str(err.value)
    with pytest.raises(FileNotFoundError, match="PACS: dataset folder .*PACS does not exist"):
        catalog.environments_of("PACS", str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no domain folders in"):
        catalog.environments_of("ImageFolder", str(tmp_path / "empty"))
    flat = tmp_path / "flat" / "photos"
    flat.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(flat / "a.jpg")
    with pytest.raises(FileNotFoundError, match="no class folders in domain folder .*photos"):
        catalog.environments_of("ImageFolder", str(tmp_path / "flat"))
    no_images = tmp_path / "no_images" / "photos" / "cat"
    no_images.mkdir(parents=True)
    (no_images / "notes.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="no image files .* in the class folders of"):
        catalog.environments_of("ImageFolder", str(tmp_path / "no_images"))


def test_the_helpers_import_no_torch(tmp_path):
    make_tree(tmp_path / "tree", {"a": {"x": ["1.jpg"]}, "b": {"x": ["2.jpg"]}})
    code = ("import sys; from dg_plugins import catalog; "
            f"print(catalog.environments_of('ImageFolder', {str(tmp_path / 'tree')!r}));"
            "catalog.check_dataset_name('PACS'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['a',", "'b']", "False"]
