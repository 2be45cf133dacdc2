"""edgeplug backend plugin for Samsung Exynos (ENN)."""
