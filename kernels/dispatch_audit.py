"""The audit of a dispatch policy: is it the policy signed, and is every bucket's choice
what its rule derives from the measurements it carries?

A policy carries its evidence (``kernels.dispatch_policy``: each bucket's timings and
refusals), so whoever holds the file can derive it again. :func:`audit_policy` holds it to
a signed fingerprint, then re-derives every bucket and compares: an evidence value edited
after signing moves the fingerprint, and one edited with the fingerprint taken again no
longer derives the recorded choice or summary. :func:`load_policy` reads a file and audits
it, so no unaudited policy is served from a file.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from kernels.dispatch_policy import DispatchPolicy, derive_policy
from kernels.errors import KernelgateError
from kernels.registry import IMPLEMENTATIONS


class PolicyError(KernelgateError, ValueError):
    """A policy that cannot be served: unreadable, not the policy its digest names, or
    not what its own evidence derives (the message names the bucket)."""


def audit_policy(policy: DispatchPolicy, sha256: str | None = None) -> None:
    """Refuse ``policy`` unless it is the one signed (``sha256``: its fingerprint as
    signed; ``None``: no digest to hold it to) and exactly what its rule derives from the
    evidence it carries, bucket by bucket.

    Raises:
        PolicyError: the fingerprint is not ``sha256`` (both named); a bucket's recorded
            choice, or a candidate's summary, differs from what its evidence derives (the
            bucket and kernel named, recorded against derived); the recorded evidence
            digest is not the evidence's.
    """
    fingerprint = policy.fingerprint()
    if sha256 is not None and fingerprint != sha256:
        raise PolicyError(f"the dispatch policy's fingerprint is {fingerprint}, "
                          f"not the {sha256} signed: it changed after signing")
    if fingerprint in _DERIVED:  # the same canonical JSON derived once here: the same result
        return
    _rederive(policy)
    _DERIVED.add(fingerprint)


_DERIVED: set[str] = set()
"""Fingerprints of policies this process derived again and found as recorded. The
fingerprint is the sha256 of the whole canonical policy, evidence, candidates, rule and
capabilities included (everything the derivation reads), so a policy with one of these
fingerprints derives as that one did; a policy read from the same file again, or served
after its plan audited it, skips the 1-3 s of deriving 162 buckets once more. A refused
policy is never remembered."""


def _rederive(policy: DispatchPolicy) -> None:
    """Every bucket derived again from the evidence ``policy`` carries, compared with its
    record (raises :class:`PolicyError` naming the first difference)."""
    try:
        derived = derive_policy(policy.evidence(), policy.candidates, policy.rule,
                                policy.capability_map())
    except ValueError as err:
        raise PolicyError(f"the dispatch policy's evidence derives no policy: {err}") from None
    for recorded, fresh in zip(policy.buckets, derived.buckets, strict=True):
        name = recorded.bucket.name
        if recorded.kernel != fresh.kernel:
            raise PolicyError(f"bucket {name!r} records {recorded.kernel}, but its evidence "
                              f"derives {fresh.kernel} ({fresh.why})")
        for old, new in zip(recorded.summaries, fresh.summaries, strict=True):
            if old != new:
                raise PolicyError(f"bucket {name!r}: {old.kernel}'s recorded summary "
                                  f"{old.model_dump(exclude_none=True)} is not its evidence's "
                                  f"{new.model_dump(exclude_none=True)}")
        if recorded != fresh:
            raise PolicyError(f"bucket {name!r}: its recorded choice ({recorded.why}) is not "
                              f"what its evidence derives ({fresh.why})")
    if derived.fingerprint() != policy.fingerprint():
        raise PolicyError(f"the dispatch policy records evidence {policy.evidence_sha256}, "
                          f"its evidence is {derived.evidence_sha256}")


def load_policy(path: str | Path, sha256: str | None = None) -> DispatchPolicy:
    """The policy in the JSON file ``path``, audited (:func:`audit_policy`; with
    ``sha256``, only if its fingerprint is that digest).

    Raises:
        PolicyError: the file is missing or not a valid policy (the reason given), the
            audit refuses it (the bucket or digests named), or it names a kernel that is not
            registered here.
    """
    try:
        policy = DispatchPolicy.model_validate_json(Path(path).read_bytes())
    except OSError as err:
        raise PolicyError(f"dispatch policy {path}: {err}") from None
    except ValidationError as err:  # one line: each field and the constraint it broke
        why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}"
                        for e in err.errors())
        raise PolicyError(f"dispatch policy {path} is not a valid policy: {why}") from None
    try:
        audit_policy(policy, sha256)
    except PolicyError as err:
        raise PolicyError(f"dispatch policy {path}: {err}") from None
    unknown = [k for k in policy.candidates if k not in IMPLEMENTATIONS]
    if unknown:  # served here, a bucket naming one would fail at its first call
        raise PolicyError(f"dispatch policy {path} names kernels this installation does not "
                          f"have: {unknown} (registered: {sorted(IMPLEMENTATIONS)})")
    return policy
