"""What a rollout signs about a candidate: the registration and what it binds, the
loosening approval, the gate's decision, approvals, shadow and canary runs, alias-change
records, the chain of evidence they form, calibrations, environment facts and stage
times."""
