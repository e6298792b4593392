"""DomainBed's seed derivation (``seed_hash`` in ``domainbed/lib/misc.py``), shared by hparams, splits and sweeps."""

import hashlib


def seed_hash(*args) -> int:
    """An int in [0, 2**31) from the md5 of the repr of the argument tuple, as DomainBed does."""
    return int(hashlib.md5(str(args).encode("utf-8")).hexdigest(), 16) % (2**31)
