"""Learning-rate schedules the framework adds to torch's (conf/scheduler)."""
