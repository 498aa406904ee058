"""The runs of one rollout: its parent run, the family lock and how it ends; the build and
evaluation runs."""
