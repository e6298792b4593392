"""Reference data of the papers dg_plugins reproduces: their settings and their published numbers."""
