"""Download DomainBed's datasets into DomainBed's layout (``python -m
dg_plugins.scripts.download``), without torch. Read sources, fetch, prepare, run; what a download
does: ``docs/download.md``."""

from dg_plugins.download.sources import (ALIASES, BUILT_IN, DATASET_SPECS,  # the table of files
                                         SOURCES, TEST_DELAY_ENV, CorruptArchive, DownloadError,
                                         Source, UnknownDataset, UsageError, download_command,
                                         resolve_names, sources_of, table_lines)
from dg_plugins.download.fetch import Reporter, human_size  # one file: resumable, checked
from dg_plugins.download.prepare import dataset_status  # layout checks, extraction
from dg_plugins.download.run import (DownloadFailed, Options, download,  # datasets, in order
                                     download_dataset, download_split_lists, tidy_present)
