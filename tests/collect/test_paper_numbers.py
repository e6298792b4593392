"""Published numbers (dg_plugins/reference/paper_numbers.json, loaded by dg_plugins.reference):
the entries the paper scripts name, their consistency with our catalogue and selection methods,
the arithmetic inside each paper row, the loader's checks, and that it imports no torch."""

import json
import subprocess
import sys

import pytest

from dg_plugins import catalog, reference
from dg_plugins.collect.selection import METHODS

#: The keys the paper scripts (``sweeps/``, dg_plugins.reference.paper_settings) pass to --paper.
AGREED_KEYS = ["dmg_pacs_resnet18", "dmg_pacs_resnet50", "dmg_domainnet_resnet18",
               "dmg_domainnet_resnet50", "gmoe_domainbed", "gmoe_single_source_domainnet",
               "dismae_udg_domainnet20", "dismae_dg", "mpbm_digits", "mpbm_pacs", "ipoop"]
#: Paper rows whose printed average is not the mean of their printed columns (kept as printed;
#: the entry's notes say so).
AVERAGE_AS_PRINTED = {("dmg_pacs_resnet18", "Aggregate [29]")}


def test_the_agreed_keys_exist():
    assert reference.keys() == AGREED_KEYS


@pytest.mark.parametrize("key", AGREED_KEYS)
def test_entries_use_our_names(key):
    entry = reference.get(key)
    assert entry.selection is None or entry.selection in METHODS
    for dataset in entry.datasets:
        assert dataset in catalog.DATASET_ENVIRONMENTS, dataset
    if entry.per_dataset:
        labels = catalog.DATASET_ENVIRONMENTS[entry.datasets[0]]
        keys = [k for k in entry.columns if k != reference.AVG]
        assert keys == [label for label in labels if label in keys]  # our names, our order
    else:
        assert list(entry.columns) == [d for d in entry.datasets if d in entry.columns]
    if entry.source is not None:
        assert entry.source in catalog.DATASET_ENVIRONMENTS[entry.datasets[0]]
    for row, algorithm in entry.ours.items():
        assert row in entry.rows and algorithm in catalog.ALGORITHM_ORDER, (row, algorithm)
    assert entry.available == bool(entry.rows)
    assert entry.available or entry.claim  # no numbers: the source's claim instead
    if entry.source_kind == "full paper":
        assert entry.read_from == "dmg_eccv2020.txt"


@pytest.mark.parametrize("key", AGREED_KEYS)
def test_printed_averages_are_the_means_of_the_printed_columns(key):
    """A transcription slip in any cell of a complete row shows here (papers round to 0.01)."""
    entry = reference.get(key)
    envs = [c for c in entry.columns if c != reference.AVG]
    checked = 0
    for row, cells in entry.rows.items():
        if (not entry.per_dataset or not envs or reference.AVG not in cells
                or not set(envs) <= set(cells)):
            continue
        mean = sum(cells[c].mean for c in envs) / len(envs)
        if (key, row) in AVERAGE_AS_PRINTED:
            assert abs(mean - cells[reference.AVG].mean) > 0.5
            assert any(str(cells[reference.AVG].mean) in note for note in entry.notes)
        else:
            assert mean == pytest.approx(cells[reference.AVG].mean, abs=0.06), row
        checked += 1
    if key.startswith("dmg_"):
        assert checked >= len(entry.rows) - 1  # all but DomainNet R18's garbled Aggregate-SGD


def test_anchor_values():
    """Spot checks against the papers' tables (DMG Table 2 and 1, GMoE Tables 1 and 3, MPBM)."""
    get = reference.get
    assert get("dmg_pacs_resnet18").rows["Aggregate*"]["S"] == reference.PaperValue(65.20)
    assert get("dmg_pacs_resnet50").rows["DMG (Ours)"]["Avg"].mean == 83.37
    assert get("dmg_domainnet_resnet18").rows["DMG (Ours)"]["quick"].mean == 14.16
    assert set(get("dmg_domainnet_resnet18").rows["Aggregate-SGD"]) == {"real", "sketch", "Avg"}
    assert get("dmg_domainnet_resnet50").rows["Aggregate"]["clip"].mean == 62.18
    assert get("gmoe_domainbed").rows["GMoE-S/16"]["DomainNet"] == reference.PaperValue(48.7, 0.2)
    assert get("gmoe_domainbed").paper_row("ERM_ViT") == "ERM (ViT-S/16)"
    assert get("gmoe_single_source_domainnet").rows["ViT-S/16"]["paint"].mean == 69.0
    assert get("mpbm_digits").rows["MPBM"]["Avg"].mean == 81.3
    assert [v["Avg"].mean for v in get("mpbm_digits").rows.values()] == [81.3, 51.7, 77.7]
    assert get("mpbm_pacs").rows["MPBM"]["Avg"].mean == 54.5
    assert get("dmg_pacs_resnet18").paper_row("ERM") == "Aggregate*"
    for key in ("dismae_udg_domainnet20", "dismae_dg", "ipoop"):
        assert not get(key).available
    assert "1.48% to 6.11%" in get("dismae_udg_domainnet20").claim


def test_values_print_as_the_paper_prints_them():
    assert reference.PaperValue(72.61).text() == "72.61"
    assert reference.PaperValue(77.6).text() == "77.6"
    assert reference.PaperValue(88.1, 0.1).text("±") == "88.1 ± 0.1"


def test_unknown_key_says_what_was_meant():
    with pytest.raises(reference.UnknownPaperKeyError) as error:
        reference.get("dmg_pacs")
    message = str(error.value)
    assert message.startswith("unknown paper key 'dmg_pacs' (did you mean 'dmg_pacs_resnet18'")
    assert "known keys: dmg_pacs_resnet18, " in message and "ipoop" in message


def write_entries(path, **changes):
    data = json.loads(open(reference.PAPER_NUMBERS_FILE).read())
    entry = data["entries"]["dmg_pacs_resnet50"]
    entry.update(changes)
    data["entries"] = {"broken": entry}
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("changes, message", [
    ({"setting": "multi"}, "setting 'multi' is not one of multi_source"),
    ({"rows": {"X": {"Q": 1.0}}}, "row 'X' has columns ['Q'] missing from 'columns'"),
    ({"rows": {"X": {"A": "high"}}}, "row 'X', column 'A': 'high' is neither a number"),
    ({"ours": {"Nope": "ERM"}}, "'ours' names rows ['Nope'] that 'rows' lacks"),
    ({"rows": {}, "ours": {}}, "must say what its source claims"),
    ({"datasets": ["PACS"]}, "give exactly one of 'dataset'"),
    ({"source": "A"}, "'source' applies to single_source entries only"),
])
def test_malformed_entries_are_named(tmp_path, changes, message):
    with pytest.raises(reference.PaperNumbersError) as error:
        reference.load(write_entries(tmp_path / "numbers.json", **changes))
    assert "entry 'broken'" in str(error.value) and message in str(error.value)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(reference.PaperNumbersError, match="is missing"):
        reference.load(str(tmp_path / "none.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(reference.PaperNumbersError, match="not valid JSON"):
        reference.load(str(tmp_path / "bad.json"))


def test_the_loader_imports_no_torch():
    code = ("import sys; from dg_plugins import reference; reference.load(); "
            "heavy = {'torch', 'dg_plugins.train', 'dg_plugins.sweep', 'dg_plugins.collect'} "
            "& set(sys.modules); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
