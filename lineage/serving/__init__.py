"""A version as it serves: logged and registered as an MLflow model with its code snapshot,
its signed file manifest, its tiling, and a runner per version (here when its code is
ours, else in its own worker process). The pyfunc wrapper itself stays
``lineage.model``: stored versions name it by that path."""
