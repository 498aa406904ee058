"""The pipeline's seal on each cached float64 reference (``evaluation.reference_cache``).

A reference array is sealed when the evaluation computes it: a DSSE envelope of an
in-toto statement (``lineage.signing.attestations``, kind ``reference``) whose one subject is
``reference/<cache key>`` with the array's sha256, signed by the pipeline's key and
written beside the array. The cache key already binds the case's digest, the reference
code, the method and the sampled rows, so the subject says "these bytes are the float64
reference of that case". Someone who can write the store but holds no pipeline key can
plant an array, copy an old seal or sign one with another key; none of them opens, and
the evaluation recomputes the entry instead of scoring against it.
"""

from __future__ import annotations

from lineage.signing.attestations import AttestationError, Signing, make_envelope, verify_envelope

SUBJECT_PREFIX = "reference/"


class SignedReferences:
    """``evaluation.reference_cache.EntrySeal`` with the pipeline's key.

    Args:
        signing: the pipeline's signer (seals) and trust (what opens a seal: the
            pipeline's current and retired keys, never a revoked one).
    """

    def __init__(self, signing: Signing):
        self.signing = signing

    def seal(self, entry) -> bytes:
        """The signed envelope (JSON bytes) of ``entry``'s key and array sha256."""
        return make_envelope("reference", {SUBJECT_PREFIX + entry.key: entry.sha256}, {
            "case_id": entry.case_id, "case_digest": entry.case_digest,
            "method": entry.method, "rows": entry.rows}, self.signing.signer)

    def opens(self, data: bytes, entry) -> bool:
        """True when ``data`` verifies with a trusted key, is a ``reference`` statement and
        names exactly ``entry.key`` with ``entry.sha256`` (the bytes as read)."""
        try:
            found = verify_envelope(data, self.signing.trust)
        except AttestationError:
            return False
        return found.kind == "reference" and found.subjects == {
            SUBJECT_PREFIX + entry.key: entry.sha256}
