"""checkpoint_io group: how checkpoint bytes reach storage."""
