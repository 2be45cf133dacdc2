"""edgeplug backend plugin for XNNPACK: the example of a third-party plugin."""
