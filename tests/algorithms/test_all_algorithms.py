"""The Algorithm contract (:mod:`dg_plugins.contract`, shipped so that a plugin's author runs it:
``python -m dg_plugins.scripts.check_algorithm MODULE``), checked on every built-in algorithm and
the test-only ones of tests/plugins/ (timm-style: the registry drives the list), on Debug28 and
Debug224 with each algorithm's ``TINY_TEST_HPARAMS``, on CPU and on CUDA when a GPU is present.
"""

import dg_plugins.algorithms  # noqa: F401  (registers)
import dg_plugins.datasets  # noqa: F401
from dg_plugins import catalog
from dg_plugins.contract import (  # noqa: F401  (the contract's tests, collected here)
    pytest_generate_tests, test_a_job_lr_schedule_scales_every_optimizer_but_the_exempt_ones,
    test_every_trainable_parameter_is_in_exactly_one_optimizer, test_one_and_three_source_domains,
    test_resume_round_trip_gives_the_records_of_an_uninterrupted_run,
    test_tiny_test_hparams_are_declared_hparams, test_updates_predict_and_state)
from dg_plugins.registry import ALGORITHMS
from support.helpers import TEST_PLUGIN_MODULES

#: Built-in algorithms and the test-only ones of tests/plugins/ (other test helpers registered
#: temporarily by single tests are not part of the contract run); read by
#: :func:`dg_plugins.contract.pytest_generate_tests`.
CONTRACT_ALGORITHMS = [n for n, cls in ALGORITHMS.items()
                       if cls.__module__.startswith("dg_plugins.")
                       or cls.__module__ in TEST_PLUGIN_MODULES]


def test_every_builtin_algorithm_is_derived_into_the_catalog():
    """Sweeps and collect_results know the built-in names without importing torch: the catalog
    derives them from the source, and must agree with the registry."""
    builtin = [n for n, cls in ALGORITHMS.items() if cls.__module__.startswith("dg_plugins.")]
    assert catalog.BUILTIN_ALGORITHMS == builtin
    assert all(name in catalog.ALGORITHM_ORDER for name in builtin)


def test_test_only_plugins_are_in_the_contract_run():
    assert "ToyTwoHeads" in CONTRACT_ALGORITHMS
