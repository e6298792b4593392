"""The staged-featurizer interface: ``stem -> named stages -> pool``, so that a method can act
on the input of a stage (DMG's masks) and on the pooled feature."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

Hook = Callable[[torch.Tensor], torch.Tensor]


class StagedFeaturizer(nn.Module):
    """A featurizer split into ``stem`` (default: the input itself), named ``stages`` and
    ``pool``; subclasses set ``stage_names``, ``stage_widths`` (inputs') and ``n_outputs``."""

    stage_names: tuple[str, ...] = ()
    stage_widths: dict[str, int]
    n_outputs: int
    #: The dimension ``stage_widths`` counts: 1 for maps and vectors, -1 for tokens.
    channel_dim: int = 1

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def stage(self, name: str) -> nn.Module:
        raise NotImplementedError

    def pool(self, h: torch.Tensor) -> torch.Tensor:
        """The last stage's output -> the ``[N, n_outputs]`` feature (pooling, dropout)."""
        raise NotImplementedError

    def check_stage(self, name: str) -> str:
        if name not in self.stage_names:
            raise ValueError(f"{type(self).__name__} has no stage {name!r}; its stages are "
                             f"{', '.join(self.stage_names)}")
        return name

    def forward_stages(self, x: torch.Tensor, start: str | None = None, stop: str | None = None,
                       hooks: dict[str, Hook] | None = None) -> torch.Tensor:
        """From the image (or stage ``start``'s input) to the pooled feature (or stage ``stop``'s
        input); ``hooks[name]`` transforms stage ``name``'s input."""
        hooks = hooks or {}
        for name in hooks:
            self.check_stage(name)
        names = list(self.stage_names)
        first = names.index(self.check_stage(start)) if start is not None else 0
        last = names.index(self.check_stage(stop)) if stop is not None else len(names)
        if first > last:
            raise ValueError(f"stage {start!r} comes after stage {stop!r}")
        h = self.stem(x) if start is None else x
        for name in names[first:last]:
            if name in hooks:
                h = hooks[name](h)
            h = self.stage(name)(h)
        return h if stop is not None else self.pool(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_stages(x)
