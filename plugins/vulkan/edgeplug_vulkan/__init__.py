"""edgeplug backend plugin for ExecuTorch's Vulkan delegate."""
