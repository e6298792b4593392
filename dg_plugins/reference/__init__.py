"""Reference data, torch-free: ``papers`` (published numbers for ``collect_results --paper``),
``paper_settings`` (every setting of the paper scripts, with sources) and ``gpu_times`` (the
measured step times behind the GPU-hours estimates)."""

from dg_plugins.reference.papers import (AVG, PAPER_NUMBERS_FILE, SETTINGS,  # published numbers
                                         SOURCE_KINDS, PaperEntry, PaperNumbersError, PaperValue,
                                         UnknownPaperKeyError, get, keys, load,
                                         unknown_key_message)
