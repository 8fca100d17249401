"""accelerator group: the device type, how many devices, placement and availability."""
