"""Fusion: pattern matches become the fused ops a backend's ``FusionPolicy`` names, in one package.

``program`` is the one entry (``fuse_program``, ``fuse_for_backend``: what ``lower`` and ``edgeplug.fuse``
run) and the only module that drives the phases, each entered once per fusion, in this order:

1. ``target``: the policy's op resolved through torch's op registry, after the policy's
   ``load_target`` (the core names no fused op itself; the registry checks a policy with it when a
   plugin loads, so this module imports torch only when asked);
2. the delegation veto, handed in by the caller (``edgeplug._partition.delegation``: the partition's
   knowledge): a fused op the backend's support check would not delegate is not made;
3. ``rms_norm``: the match phase (``find_rms_norms``), every node asked once; the strict matcher,
   with ``rms_norm_guards`` holding each proof;
4. ``decision``: each match gets a pure ``Decision`` (outcome, what the fused op's weight is, why),
   then the veto;
5. ``fold``: every weight the decisions fold and every unit weight they need becomes a constant, in
   one ``edgeplug._graph.fold_constants`` call;
6. ``rewrite``: each match replaced by the policy's op; one ``FusionRecord`` per candidate.

Below the phases: ``nodes`` (what fusion reads of a node: ``NoMatch``, op, cast and dtype
predicates, over ``edgeplug._graph.ops``) and ``ops`` (the nodes fusion makes, in the program's
dialect). No module here calls a module above it. Importing this package loads nothing.
"""
