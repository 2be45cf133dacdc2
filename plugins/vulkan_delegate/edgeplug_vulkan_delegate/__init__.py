"""What every backend on executorch's Vulkan delegate shares (vulkan, webgpu, a third party's).

A library distribution (``edgeplug-vulkan-delegate``): it has no backend and
no ``edgeplug`` entry point of its own; the plugins that serialize through
the Vulkan delegate depend on it and yield its records under their own names.

- ``records``: the backend spec, the ops kept whole, the weight-only quantization schemes.
- ``fusion``: the ``et_vk.rms_norm`` fusion policy.
- ``rewrites``: the core's rewrites the delegate's ops call for, and the family's own pass.
- ``support``: the per-node support check (executorch's ``VulkanSupportedOperators``, with its reasons).
- ``preprocess``: what the delegate's preprocess does to constants, for host verification.
- ``_executorch``: every reach into executorch's Vulkan internals (patches, each restored on exit; private attributes).
- ``kernel_contract``: the ``et_vk.rms_norm`` kernel contract (argument checks, buffer layout,
  workgroup shape, launch) the plugins' shaders implement.
- ``testing``: the test suite every ``et_vk.rms_norm`` kernel runs (imports pytest).

Importing this package is cheap; each module loads torch or executorch when it needs them.
"""
