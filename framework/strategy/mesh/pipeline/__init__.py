"""The pipeline of the mesh strategy: torch's schedules and their rules (schedules.py), the
settings (settings.py), one worker's stages and schedule (run.py), the forward across ranks for
evaluation (forward.py), a tied head across stages (tied.py), the checkpoint state merged and cut
(state.py), and what `framework plan` says (plan.py)."""
