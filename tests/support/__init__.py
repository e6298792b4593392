"""The suite's shared helpers (imported as ``support.<module>``; ``tests/`` is on ``sys.path``
through ``tests/conftest.py`` and on every command's ``PYTHONPATH`` through
``support.processes.command_env``): subprocess runners, job gates, fixture data makers, and the
test-only plugin algorithms jobs import by name (``DG_PLUGINS_IMPORT=support.<module>``)."""
