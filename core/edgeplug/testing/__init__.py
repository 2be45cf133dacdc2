"""Helpers and the conformance suite for plugin authors (see ``edgeplug.testing.plugin``)."""
