"""Metric loggers (conf/logger): csv (default), tensorboard. Several can be used together."""
