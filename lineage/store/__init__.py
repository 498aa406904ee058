"""The MLflow store itself: where it is and how to reach it, runs and artifacts with their
sha256, tag names, a family's names, who owns a family, and a store's identity."""
