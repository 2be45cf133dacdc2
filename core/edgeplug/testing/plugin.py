"""pytest plugin: fixtures for plugin authors. Importing it is cheap."""
