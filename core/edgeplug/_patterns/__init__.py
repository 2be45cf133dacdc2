"""Strict pattern matchers, each with the guards that prove a match equivalent.

A matcher takes a node of an ExportedProgram and returns a match object (truthy)
describing what the fused op would compute, or a ``NoMatch`` (falsy) that says
why not. ``edgeplug._fusion`` turns matches into fused ops under a backend's
``FusionPolicy``; matchers never change the graph.
"""

from edgeplug._patterns.base import NoMatch
from edgeplug._patterns.rms_norm import RmsNormMatch, inverse_rms_of_mean, match_rms_norm

__all__ = ["NoMatch", "RmsNormMatch", "inverse_rms_of_mean", "match_rms_norm"]
