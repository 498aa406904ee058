"""The family's append-only signed log: read back and checked, its one writer, the
sequencer a server claims positions with, the pipeline's and the auditor's checkpoints."""
