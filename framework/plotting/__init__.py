"""Figures of runs and sweeps (`framework plot`, and at the end of every run): matplotlib, an
optional extra (`pip install 'framework[plot]'`), imported only when a figure is drawn."""
