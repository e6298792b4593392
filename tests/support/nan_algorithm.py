"""A test-only algorithm whose loss turns NaN at its third update (for the train loop's guard)."""

import torch

from dg_plugins.algorithms import ERM


class NaNAfterTwoSteps(ERM):
    def __init__(self, *args):
        super().__init__(*args)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def update(self, minibatches, unlabeled=None):
        self.calls += 1
        out = super().update(minibatches, unlabeled)
        return {"loss": float("nan")} if self.calls >= 3 else out
