"""dg_plugins: recent domain-generalization methods and IP/OOP evaluation for DomainBed.

Importing the top-level package is cheap (no torch): the registries fill when their modules are
imported (``dg_plugins.algorithms``, ``dg_plugins.datasets``, ``dg_plugins.sweep.launchers``).
"""

__version__ = "0.1.0"
