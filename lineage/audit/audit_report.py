"""What an audit found: the chain it followed, link by link, and every problem; its
terminal text and exit code (``lineage.audit.audit`` produces it)."""

from __future__ import annotations

from pydantic import BaseModel

GATE_LINK = "gate decision"
"""The chain link of a version's signed gate decision (``ref`` None: none signed)."""


class AuditLink(BaseModel):
    """One link of the chain: ``name``, the run or version it resolved to, its state."""

    name: str
    ref: str | None
    ok: bool
    detail: str


class AuditReport(BaseModel):
    """What was checked and every problem found (empty when the audit passes)."""

    family: str
    target: str
    model_name: str
    version: str | None
    aliases: dict[str, str]
    signed_aliases: dict[str, str]
    chain: list[AuditLink]
    registrations: list[str]
    attestations_verified: int
    artifacts_verified: int
    artifacts_checked: int
    problems: list[str]
    warnings: list[str] = []  # said, not failing: a legacy prefix, a re-anchored gap
    key_changes: list[str] = []  # the family log's key changes, in log order
    notices: list[str] = []  # said on every audit, not failing: the roster named on first use
    absent: str | None = None  # the target names no version: why, and what there is instead

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    @property
    def exit_code(self) -> int:
        """0 when the audit passes; 1 on any problem; 3 when the log verifies but the
        target names no version (nothing of a version's chain was assessed)."""
        return 1 if not self.ok else 3 if self.absent else 0

    @property
    def never_judged(self) -> bool:
        """True when the chain holds the version's build but no signed gate decision: a
        version built and never judged (its rollout died or stopped before the gate).
        Its records can verify; the summary still says that nothing judged it."""
        return (any(link.name == "build" for link in self.chain)
                and any(link.name == GATE_LINK and link.ref is None for link in self.chain))

    def summary(self) -> str:
        """One line: what was verified, and the verdict (and that the version was never
        judged, where so: a passing audit of its records is no verdict on it)."""
        if self.ok and self.absent:
            return (f"NOTHING TO AUDIT: {self.model_name} {self.target}: {self.absent}; "
                    f"{self.attestations_verified} attestations verified, no problem")
        judged = " (built, never judged: no gate decision signed)" if self.never_judged else ""
        return (f"{'AUDIT PASSED' if self.ok else 'AUDIT FAILED'}: {self.model_name} "
                f"{self.target} -> {f'v{self.version}' if self.version else 'no version'}{judged}; "
                f"{self.attestations_verified} attestations and "
                f"{self.artifacts_verified}/{self.artifacts_checked} artifacts verified; "
                f"{len(self.problems)} problem(s)")

    def render(self) -> str:
        """A plain-text report for the terminal."""
        held = [a for a, v in self.aliases.items() if v == self.version]
        lines = [f"audit {self.model_name} {self.target} -> "
                 + (f"no version ({self.absent})" if self.absent else f"version {self.version}")
                 + (f" (aliases: {', '.join(held)})" if held and not self.absent else "")]
        lines += [f"  [{'ok' if link.ok else 'FAIL'}] {link.name}: {link.ref or '-'}  {link.detail}"
                  for link in self.chain]
        if self.registrations:
            lines.append("  registrations (oldest first):")
            lines += [f"    {r}" for r in self.registrations]
        if self.key_changes:
            lines.append("  key changes (signed log order):")
            lines += [f"    {k}" for k in self.key_changes]
        lines += [f"  NOTICE: {n}" for n in self.notices]
        lines += [f"  WARNING: {w}" for w in self.warnings]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines.append(self.summary())
        return "\n".join(lines)


class Walk:
    """The audit as it goes: the chain links shown and every problem found."""

    def __init__(self) -> None:
        self.links: list[AuditLink] = []
        self.problems: list[str] = []

    def link(self, name: str, ref: str | None, ok: bool, detail: str, *, problem: bool = True):
        """Show one link; a failed one is also a problem unless ``problem=False`` (a
        finding shown, counted elsewhere or not at all)."""
        self.links.append(AuditLink(name=name, ref=ref, ok=ok, detail=detail))
        if not ok and problem:
            self.problems.append(f"{name} {ref or ''}: {detail}".replace("  ", " "))
