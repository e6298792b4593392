"""``python -m dg_plugins.scripts.check_data --dataset NAME --data_dir DIR``: find unreadable images.

Decodes every image of an image-folder dataset exactly as training does (PIL, fully loaded and
converted to RGB, so truncated files are caught, not only unidentifiable ones), in parallel over
the CPUs this process may use, with a progress bar when stderr is a terminal. Prints every
unreadable file with its error, then one summary line per environment.

Any registered image-folder dataset works: PACS, VLCS, OfficeHome, TerraIncognita, DomainNet, the
generic ``ImageFolder`` (``--data_dir`` is then the folder holding the domain folders) and datasets
made with ``make_image_folder_dataset`` in a plugin module named in ``$DG_PLUGINS_IMPORT``.

Exit status: 0 every image is readable; 1 some image is unreadable; 2 bad input (unknown dataset,
a plugin module that does not import, a dataset that has no image files, a missing folder or a
bad layout, e.g. a ``--data_dir`` one level above or below the tree: the folder meant is named).
"""

import sys

from dg_plugins.datasets.check import (BadInput, available_cpus, build_parser, load_dataset,
                                       run_check)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 0:
        parser.error(f"--workers must be >= 0, got {args.workers}")
    workers = available_cpus() if args.workers is None else args.workers
    from dg_plugins import plugins

    try:
        plugins.load()  # a plugin's image-folder dataset is known
        dataset = load_dataset(args.dataset, args.data_dir)
    except (BadInput, plugins.PluginImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    n_bad = run_check(dataset, workers, progress=sys.stderr.isatty())
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
