"""edgeplug backend plugin for ExecuTorch's WebGPU delegate."""
