"""Models the framework ships for its examples and tests."""
