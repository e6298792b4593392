"""Peak memory of a training step: the bytes an algorithm holds and the peak of one step's own
allocations (CUDA's peak statistics, or the torch profiler's events on a CPU)."""

from __future__ import annotations

import contextlib
import itertools
import os
import sys


@contextlib.contextmanager
def stderr_fd_silenced():
    """Keep the profiler's C++ start/stop lines on fd 2 out of the report."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def persistent_bytes(algorithm) -> int:
    """Bytes of the algorithm's state dict and its optimizers' state, each storage once."""
    import torch

    tensors = [*algorithm.state_dict().values(),
               *(v for opt in algorithm.optimizers().values() for state in opt.state.values()
                 for v in state.values() if torch.is_tensor(v))]
    storages = {(t.untyped_storage().data_ptr(), t.device): t.untyped_storage().nbytes()
                for t in tensors}
    return sum(storages.values())


def step_peak_bytes(algorithm, batches, device, step=None) -> int:
    """Peak bytes allocated during one update (``step()``, default ``algorithm.update``) above
    what was allocated before it."""
    import torch

    if step is None:
        def step():
            algorithm.update(batches, None)

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with stderr_fd_silenced(), profile(activities=[ProfilerActivity.CPU],
                                       profile_memory=True) as prof:
        step()
    allocations = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                         if e.name() == "[memory]")
    return max(itertools.accumulate((nbytes for _, nbytes in allocations), initial=0))
