"""Graph transforms every backend shares: the pass runner (names, lint)."""

from edgeplug.graph.passes import run_passes

__all__ = ["run_passes"]
