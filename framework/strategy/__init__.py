"""strategy group: wraps model and optimizer, owns processes and collectives, backward and step."""
