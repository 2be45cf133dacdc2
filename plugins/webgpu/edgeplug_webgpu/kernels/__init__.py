"""Runtime kernels of the WebGPU backend (WGSL, run through wgpu). Needs torch, numpy and wgpu only."""

from edgeplug_webgpu.kernels.rms_norm import check_call as check_rms_norm, prepare as prepare_rms_norm, rms_norm, wgsl_source

__all__ = ["rms_norm", "prepare_rms_norm", "check_rms_norm", "wgsl_source"]
