"""Canonicalizing rewrites a backend chooses from.

Each rewrite replaces an op a backend refuses by ops that compute the same
values bit for bit and that the backend does take. A backend asks for the
ones it wants through its ``edgeplug_passes`` hook::

    from edgeplug.plugin import rewrite_pass

    @edgeplug.hookimpl
    def edgeplug_passes():
        yield rewrite_pass("mean_at_rank", backend="mybackend", rank=4, dims=(2, 3))
        yield rewrite_pass("scalar_to_tensor", backend="mybackend")

Every rewrite is a function ``fn(ep, **params) -> list[TransformRecord]``:
it runs on an edge-dialect program (aten programs work too), changes it in
place, leaves alone what it cannot prove equal (symbolic sizes wherever the
result depends on a size, tensors that are not contiguous, dtypes outside
``dtypes``) and returns one record per change (the report's
``transforms``). ``FLOATS`` (``base``) is float32 and float16: the dtypes
XNNPACK's ops take by default.

The rewrites live in one module per family, each module's docstring saying
what each of its rewrites does and why it is exact:

- ``shape``: views, copies, expands, splits and selects;
- ``elementwise``: scalar operands as tensors, elementwise ops and ``cat``
  at a lower rank;
- ``reductions``: the rank, dims, keepdim and dtype a reduction runs in;
- ``masks``: constant masks and fills as slices and pads;
- ``scans``: short cumulative sums (a state-space layer's) as adds;
- ``attention``: rotary embedding's ``rotate_half`` as a matmul and the safe
  softmax's bool guards as float ops, at symbolic sizes;
- ``duplicates``: the same pure op on the same inputs computed once.

``table`` holds the one literal table of them by name (``REWRITES``),
``rewrite_pass`` (the ``PassSpec`` a backend yields) and ``apply_rewrite``
(one rewrite run on a program directly). This package imports nothing: a
family module is imported where it is used.
"""
