"""Key rotation that keeps production: the current aliases re-attested with the new key.

``kernelgate keys rotate`` retires the pipeline key (``lineage.signing.keys.rotate``) and then,
for every family of the store, signs with the *new* key one ``reattest`` alias move per
alias the signed history currently sets (same version, next sequence number, chained to
the previous move). Nothing moves: the aliases already say that. A later
``keys revoke <old>`` revokes the old key from its retirement (``lineage.signing.keys.revoke``),
so everything it signed before stays valid; and even a revocation from the start (every
old signature void) leaves the re-attested moves, signed by the new key, saying where
each alias is — the reconcile every rollout starts with then changes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime

from lineage.aliases.registered_model import signed_aliases, store_alias_history
from lineage.aliases.registry import AliasChange
from lineage.records.records import log_alias_change
from lineage.signing.attestations import Signing
from lineage.store.tracking import Tracking

MODEL_PREFIX = "kernelgate-"


def families(tracking: Tracking) -> list[str]:
    """Families with a registered model in the store."""
    models = tracking.client().search_registered_models(max_results=1000)
    return sorted(m.name.removeprefix(MODEL_PREFIX) for m in models
                  if m.name.startswith(MODEL_PREFIX))


def reattest(tracking: Tracking, family: str, signing: Signing, *, reason: str,
             to: dict[str, str] | None = None) -> list[str]:
    """Sign ``reattest`` alias moves with ``signing``; returns ``alias -> v<version>``
    lines for what was signed. Moves no alias in MLflow.

    Args:
        to: the aliases to attest (alias -> version; an alias the signed history sets and
            ``to`` lacks is attested as removed), each signed only where the signed history
            says otherwise (a re-anchor: the aliases as MLflow shows them). None: every
            alias the signed history sets, signed again as it is (a key rotation: the
            same state under the new key).
    """
    moves, _ = store_alias_history(tracking, family, signing.trust)
    signed = signed_aliases(moves)
    wanted = signed if to is None else to
    done = []
    for alias in sorted(set(wanted) | set(signed)):
        if to is not None and wanted.get(alias) == signed.get(alias):
            continue
        change = AliasChange(family=family, alias=alias, version=wanted.get(alias),
                             previous_version=signed.get(alias), at=datetime.now(UTC),
                             action="reattest", reason=reason)
        log_alias_change(tracking, change, signing=signing, sequence=len(moves) + 1,
                         previous_envelope=moves[-1].envelope_sha256 if moves else None)
        moves, _ = store_alias_history(tracking, family, signing.trust)
        done.append(f"{alias} -> v{wanted.get(alias)}")
    return done
