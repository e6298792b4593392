"""Algorithms: importing this package registers every built-in algorithm."""

from dg_plugins.algorithms.base import ERM, Algorithm, adam, register_algorithm

__all__ = ["Algorithm", "ERM", "adam", "register_algorithm"]
