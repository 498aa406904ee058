"""Signed evidence: in-toto statements in DSSE envelopes, the key files and their roles,
where signed evidence is read (the store, a bundle), a person's signed approval, the
seal on cached references."""
