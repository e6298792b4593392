"""The commands, ``python -m dg_plugins.scripts.NAME`` (train, sweep, collect_results, reproduce,
download, check_data, ...): thin entry points, each imported on its own; nothing imports them."""
