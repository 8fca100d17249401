"""Callbacks (conf/callbacks): checkpoint, early_stopping, lr_monitor; progress output."""
