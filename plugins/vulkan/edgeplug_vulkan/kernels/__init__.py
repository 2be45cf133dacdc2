"""Runtime kernels of the Vulkan backend (GLSL #version 450, run through wgpu). Needs torch, numpy and wgpu only."""

from edgeplug_vulkan.kernels.rms_norm import check_call as check_rms_norm, glsl_source, prepare as prepare_rms_norm, rms_norm

__all__ = ["rms_norm", "prepare_rms_norm", "check_rms_norm", "glsl_source"]
