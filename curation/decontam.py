"""Keep rows out of the dataset when their kernel is in a benchmark's sources.

`--exclude FILE...` names files (or folders, read recursively) holding code a dataset user
evaluates on, e.g. a benchmark's kernels. A row whose kernel shares at least `overlap` of its
distinct 10-token n-grams with them is dropped: long n-grams rarely recur by chance in code,
while a copied kernel keeps most of its n-grams even after renames and reformatting. Comments
are ignored on both sides, and string literals are read as code (benchmarks such as KernelBench
keep their CUDA sources in Python strings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from curation.dedup import tokens

NGRAM = 10
DEFAULT_OVERLAP = 0.5
_MAX_BYTES = 8 << 20


def _grams(toks: list[str]) -> set[int]:
    return {hash(" ".join(toks[i : i + NGRAM])) for i in range(len(toks) - NGRAM + 1)}


@dataclass
class Excluded:
    """The n-grams of the excluded sources, and which file each came from."""

    grams: dict[int, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, paths: list[Path]) -> Excluded:
        found = cls()
        for path in paths:
            if not path.exists():
                raise FileNotFoundError(f"--exclude {path}: no such file or folder")
            for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
                if not f.is_file() or f.stat().st_size > _MAX_BYTES:
                    continue
                data = f.read_bytes()
                if b"\0" in data[:4096]:
                    continue
                name = f.relative_to(path.parent).as_posix()  # as given, not this machine's
                found.files.append(name)
                for g in _grams(tokens(data.decode("utf-8", errors="replace"), strings=False)):
                    found.grams.setdefault(g, name)
        return found

    def match(self, source: str, overlap: float = DEFAULT_OVERLAP) -> tuple[float, str]:
        """(share of the source's n-grams found, the file most of them come from) when the
        share reaches `overlap`, else (share, '')."""
        grams = _grams(tokens(source, strings=False))
        if not grams or not self.grams:
            return 0.0, ""
        hits = [self.grams[g] for g in grams if g in self.grams]
        share = len(hits) / len(grams)
        if share < overlap:
            return share, ""
        return share, max(set(hits), key=hits.count)
