"""How ``et_vk.rms_norm`` is fused for the Vulkan delegate's runtime (vulkan, webgpu).

- ``rms_norm_policy``: the core's fusion policy for a runtime that prepacks
  the fused op's weight.
- ``load_et_vk_ops``: registers executorch's ``et_vk`` custom ops, so the core
  can resolve the policy's ``et_vk.rms_norm`` target.

Keeping executorch's own RMSNorm fusion out of the lowering (the switch the
core's fusion relies on) is a patch of executorch and lives with the other
one in ``edgeplug_vulkan_delegate._executorch``.
"""

from __future__ import annotations

from edgeplug.plugin import FusionPolicy


def load_et_vk_ops() -> None:
    """Register the ``et_vk`` ops (``torch.ops.et_vk.rms_norm``, ...)."""
    import executorch.backends.vulkan.custom_ops_lib  # noqa: F401


def rms_norm_policy(backend: str, *, fp32_accumulation: bool) -> FusionPolicy:
    """``et_vk.rms_norm(input, weight, eps)`` for a runtime that prepacks the weight.

    Only a leaf constant of shape [D] may be the fused op's weight; computed
    constants are folded first; a runtime scale stays a separate multiply
    after a unit-weight norm. ``fp32_accumulation`` is the backend's kernel's
    own property.
    """
    return FusionPolicy(
        backend=backend,
        pattern="rms_norm",
        target="et_vk.rms_norm",
        arguments=("input", "weight", "eps"),
        load_target=load_et_vk_ops,
        dequantized_weights="fold",
        weight_sources=frozenset({"leaf"}),
        fold_computed_constants=True,
        unit_weight_fallback=True,
        fp32_accumulation=fp32_accumulation,
    )
