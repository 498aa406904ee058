"""The audit: every signature re-verified, verdicts re-derived, the chain, the alias
history, the store's view against what is signed, canary looks and references re-
checked; its report and the offline bundle."""
