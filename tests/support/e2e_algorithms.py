"""Test-only algorithms for end-to-end runs of the real commands; a subprocess imports this
module through ``DG_PLUGINS_IMPORT=e2e_algorithms`` (the pytest process never registers them)."""

import time

from dg_plugins.algorithms import ERM
from dg_plugins.algorithms.base import register_algorithm
from support.nan_algorithm import NaNAfterTwoSteps

SECONDS_PER_STEP = 0.15


@register_algorithm("SlowERM")
class SlowERM(ERM):
    """ERM that sleeps in every update, so that a signal reliably lands mid-run."""

    def update(self, minibatches, unlabeled=None):
        time.sleep(SECONDS_PER_STEP)
        return super().update(minibatches, unlabeled)


register_algorithm("NaNERM")(NaNAfterTwoSteps)
