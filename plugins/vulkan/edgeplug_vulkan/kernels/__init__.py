"""Runtime kernels of the Vulkan backend: GLSL compiled to SPIR-V by glslang, run through wgpu. Needs torch, numpy, wgpu and glslang."""

from edgeplug_vulkan.kernels.glslang import GlslangNotFound, compile_glsl, find_glslang
from edgeplug_vulkan.kernels.rms_norm import check_call as check_rms_norm, glsl_source, prepare as prepare_rms_norm, rms_norm, spirv as rms_norm_spirv

__all__ = ["rms_norm", "prepare_rms_norm", "check_rms_norm", "glsl_source", "rms_norm_spirv", "compile_glsl", "find_glslang", "GlslangNotFound"]
