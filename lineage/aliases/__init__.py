"""The registered model and its aliases: versions, version and link tags, the alias-moving
wall (signed intent, then the move), the production story told from the signed moves,
and what re-attests the aliases (key rotation, key changes, re-anchoring a damaged log)."""
