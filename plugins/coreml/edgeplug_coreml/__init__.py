"""edgeplug backend plugin for Apple Core ML."""
