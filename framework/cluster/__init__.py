"""cluster group: world size, ranks, main address/port, and who creates the processes."""
