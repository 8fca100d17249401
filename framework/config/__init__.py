"""Configuration: the structured schema, value checks, `_target_` checks and compatibility rules."""
