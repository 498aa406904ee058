"""Real text for the ordinary test cases: documents present on any install.

Two sources:

* the long descriptions (README text) of the installed Python distributions, read
  through ``importlib.metadata``, with markup stripped lightly and only English
  prose paragraphs kept;
* a folder the user names (``*.txt`` and ``*.md`` files, read as UTF-8).

Documents are assigned to the splits ``tuning``/``heldout``/``confirmation`` by
hashing their *name* (never their position in a listing), so a document lands in
the same split on every machine and no document serves two splits. The set of
installed distributions differs between machines (a CI venv, a GPU host), so the
documents a split receives, and with them the digests of the ordinary test cases,
depend on what is installed; the test-set manifest records each document's name and
sha256 so that a build can be traced and compared.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from evaluation.cases import SPLITS, Split

_STOPWORDS = frozenset({
    "the", "a", "an", "and", "or", "of", "to", "in", "is", "are", "for", "with", "on", "that",
    "this", "it", "be", "as", "by", "can", "from", "you", "your", "not", "which", "will", "at",
    "if", "all", "when", "use", "used", "have", "has", "was", "were", "more", "than", "its",
    "into",
})
_FENCED_CODE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_HTML_TAG = re.compile(r"</?[A-Za-z][^>]*>")
_MD_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_RST_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_{1,2}")
_RST_ROLE = re.compile(r":[a-z:]+:`([^`]+)`")
_URL = re.compile(r"https?://\S+")
_BADGE = re.compile(r"\|[^|\s][^|]*\|_?")
_INLINE_MARKS = re.compile(r"[`*_]{1,3}")
_RULE = re.compile(r"^\s*([=\-~^#*+_])\1{2,}\s*$")
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s*")


class Document(BaseModel):
    """One text document.

    Attributes:
        name: stable identifier, e.g. ``dist:requests`` or ``file:notes.md``
            (split assignment hashes it).
        text: cleaned UTF-8 prose.
        sha256: hex digest of ``text`` encoded as UTF-8.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    text: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @classmethod
    def from_text(cls, name: str, text: str) -> Document:
        """A document whose digest is computed from ``text``."""
        return cls(name=name, text=text, sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())

    def ref(self) -> DocumentRef:
        """The manifest entry (name and digest, no text)."""
        return DocumentRef(name=self.name, sha256=self.sha256)


class DocumentRef(BaseModel):
    """What a manifest records about a document: its name and content digest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def _drop_blocks(text: str) -> str:
    """Remove code: fenced blocks, reST directive blocks and indented blocks."""
    text = _FENCED_CODE.sub("", text)
    text = _HTML_COMMENT.sub("", text)
    kept: list[str] = []
    in_directive = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(".. ") or stripped.endswith("::"):
            # A reST directive or literal block owns the indented lines after it.
            in_directive = True
            if stripped.endswith("::") and not stripped.startswith(".. "):
                kept.append(stripped.rstrip(":") + ".")
            continue
        if in_directive and (not stripped or line[:1].isspace()):
            continue
        in_directive = False
        if line.startswith(("    ", "\t")) and not stripped.startswith(("-", "*", "+")):
            continue
        kept.append(line)
    return "\n".join(kept)


def _clean_inline(paragraph: str) -> str:
    for pattern, repl in ((_MD_IMAGE, ""), (_MD_LINK, r"\1"), (_RST_LINK, r"\1"),
                          (_RST_ROLE, r"\1"), (_HTML_TAG, ""), (_URL, ""), (_BADGE, ""),
                          (_INLINE_MARKS, "")):
        paragraph = pattern.sub(repl, paragraph)
    return " ".join(paragraph.split())


def _is_prose(paragraph: str, *, min_words: int = 8, min_stopword_fraction: float = 0.08,
              min_letter_fraction: float = 0.7) -> bool:
    """English prose test: enough words, mostly letters, and common English
    function words among them (a cheap language filter, no model needed)."""
    words = paragraph.split()
    if len(words) < min_words:
        return False
    letters = sum(c.isascii() and c.isalpha() for c in paragraph)
    if letters < min_letter_fraction * sum(not c.isspace() for c in paragraph):
        return False
    stop = sum(w.lower().strip(".,;:!?()\"'") in _STOPWORDS for w in words)
    return stop >= min_stopword_fraction * len(words)


@functools.lru_cache(maxsize=4096)
def clean_markup(text: str) -> str:
    """Strip Markdown/reST/HTML markup lightly and keep English prose paragraphs.

    A pure function of ``text``, so its results are kept per process: a rollout reads the
    installed distributions' descriptions up to three times (the model check's documents,
    the traffic, the evaluation) and the regular expressions over their ~200 READMEs were
    about 3 % of a test rollout's CPU (py-spy, BENCHMARKS.md "The suite in minutes").

    Code blocks, directives, tables, badges, rules and headings are dropped; links
    keep their text. Paragraphs are joined by a blank line.

    Args:
        text: raw README-like text.

    Returns:
        The prose, possibly empty.
    """
    lines = [line for line in _drop_blocks(text).splitlines() if not _RULE.match(line)]
    paragraphs = re.split(r"\n\s*\n", "\n".join(_MD_HEADING.sub("", ln) for ln in lines))
    prose = [p for p in (_clean_inline(p) for p in paragraphs) if _is_prose(p)]
    return "\n\n".join(prose)


def _dedupe(documents: Iterable[Document]) -> list[Document]:
    """First document per name and per text digest, sorted by name."""
    by_name: dict[str, Document] = {}
    seen_text: set[str] = set()
    for doc in sorted(documents, key=lambda d: (d.name, d.sha256)):
        if doc.name in by_name or doc.sha256 in seen_text:
            continue
        by_name[doc.name] = doc
        seen_text.add(doc.sha256)
    return list(by_name.values())


def installed_documents(*, min_chars: int = 800, max_chars: int = 20_000) -> list[Document]:
    """Long descriptions of the installed Python distributions, cleaned to prose.

    Read once per environment in a process (``importlib.metadata`` parses every
    distribution's metadata: about 2 % of a test rollout's CPU, paid by each rollout in a
    test process): again when ``sys.path`` or one of its folders changes (a distribution
    installed or removed changes its folder's modification time).

    Args:
        min_chars: drop documents with less prose than this (characters).
        max_chars: truncate the prose at a paragraph boundary near this length.

    Returns:
        Documents named ``dist:<normalised distribution name>``, deduplicated and
        sorted by name. Which ones exist depends on the environment.
    """
    return list(_installed_documents(min_chars, max_chars, _environment()))


def _environment() -> tuple[tuple[str, int | None], ...]:
    """``sys.path``'s entries with their modification times (``None``: not a folder)."""
    found = []
    for entry in sys.path:
        try:
            found.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            found.append((entry, None))
    return tuple(found)


@functools.lru_cache(maxsize=4)
def _installed_documents(min_chars: int, max_chars: int, environment: tuple
                         ) -> tuple[Document, ...]:
    del environment  # the cache's key only
    docs: list[Document] = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if not name:
            continue
        raw = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        text = _truncate(clean_markup(str(raw)), max_chars)
        if len(text) >= min_chars:
            docs.append(Document.from_text(f"dist:{_normalise(name)}", text))
    return tuple(_dedupe(docs))


def folder_documents(folder: str | Path, *, min_chars: int = 200,
                     max_chars: int = 20_000) -> list[Document]:
    """``*.txt`` and ``*.md`` files of a folder (not recursive), cleaned to prose.

    Args:
        folder: directory to read.
        min_chars, max_chars: as ``installed_documents``.

    Returns:
        Documents named ``file:<file name>``, deduplicated and sorted by name.

    Raises:
        FileNotFoundError: the folder does not exist.
        ValueError: it holds no usable document.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"documents folder {folder} does not exist")
    docs = []
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() in (".txt", ".md") and path.is_file():
            text = _truncate(clean_markup(path.read_text(encoding="utf-8", errors="replace")),
                             max_chars)
            if len(text) >= min_chars:
                docs.append(Document.from_text(f"file:{path.name}", text))
    if not docs:
        raise ValueError(f"no .txt/.md file in {folder} holds at least {min_chars} characters "
                         "of English prose")
    return _dedupe(docs)


def _normalise(name: str) -> str:
    # PEP 503 normalisation, so "PyYAML" and "pyyaml" name the same document.
    return re.sub(r"[-_.]+", "-", name).lower()


def _truncate(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    cut = text.rfind("\n\n", 0, max_chars)
    return text[: cut if cut > 0 else max_chars]


def split_of(name: str) -> Split:
    """The split a document belongs to: sha256 of its name modulo 3.

    Depends only on the name, so adding or removing other documents never moves it.
    """
    return SPLITS[int(hashlib.sha256(name.encode("utf-8")).hexdigest(), 16) % len(SPLITS)]


def assign_splits(documents: Iterable[Document], *,
                  per_split: int | None = None) -> dict[Split, list[Document]]:
    """Partition documents into the splits by ``split_of``, keeping the first
    ``per_split`` of each split by name (all when ``None``).

    Returns:
        ``{split: documents sorted by name}`` for every split (possibly empty lists).
    """
    out: dict[Split, list[Document]] = {s: [] for s in SPLITS}
    for doc in sorted(documents, key=lambda d: d.name):
        out[split_of(doc.name)].append(doc)
    if per_split is not None:
        out = {s: docs[:per_split] for s, docs in out.items()}
    return out


def load_documents(documents_dir: str | Path | None = None) -> list[Document]:
    """The documents of a named folder, or the installed distributions' when ``None``."""
    return installed_documents() if documents_dir is None else folder_documents(documents_dir)
