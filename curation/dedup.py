"""Duplicate kernels across everything exported together: exact copies and near copies.

Real repositories copy kernels from each other (mmcv, mmdetection3d, OpenPCDet, detectron2 and
maskrcnn-benchmark share bodies), and a benchmark scored on rows that are one kernel twice
counts it twice. Exact duplicates have the same tokens once comments and whitespace are gone.
Near duplicates are judged on the Jaccard similarity of 5-token shingles, with thresholds set
from measured pairs (benchmarks/near_dups.py on mmcv, OpenPCDet, Pointnet2_PyTorch):
- anywhere: >= 0.85. Siblings inside one repository sit anywhere from 0.07 to 0.95 (mmcv's two
  iou3d NMS kernels differ by one call: 0.95; its DCNv1/v2 col2im: 0.87), so only the closest
  are one task;
- between two repositories: >= 0.7, or >= 0.5 for kernels whose names share a stem. Copies
  that were reformatted and renamed land at 0.5-0.8 (mmcv's roiaware_avgpool3d against
  OpenPCDet's: 0.69; three_nn_forward_cuda_kernel against three_nn_kernel_fast: 0.62).
MinHash (128 permutations, LSH in 32 bands of 4 rows) proposes the pairs worth comparing, so the
work grows with the rows, not their pairs; the exact Jaccard decides. Rows are kept best first:
the best tested (kill rate, cases, shapes), then the one from the workdir given first (the
original, when the user lists it first), then the first by id; a row is dropped only as the
copy of a row kept, and names it.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

NUM_PERM, BANDS = 128, 32
ROWS = NUM_PERM // BANDS
SHINGLE = 5
DEFAULT_THRESHOLD = 0.85  # anywhere
CROSS_REPO_THRESHOLD = 0.7  # between two repositories
SAME_NAME_FLOOR = 0.5  # between two repositories, for kernels of the same name stem
_PLACE_WORDS = {"kernel", "cuda", "gpu", "fast", "forward", "fwd", "impl", "device", "global"}
_MASKS = (
    np.random.RandomState(20261124).randint(0, 1 << 62, NUM_PERM, dtype=np.int64).astype(np.uint64)
)  # one per permutation: h_i(x) = mix(x ^ mask_i), a splitmix64 finaliser (wraps mod 2^64)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?(?:\*/|\Z)", re.S)  # an unclosed /* ends it: linear
_CODE_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|\S")
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|\S")


def tokens(source: str, strings: bool = True) -> list[str]:
    """C/C++/CUDA tokens of `source`, comments dropped; with strings=False a string literal is
    read as code too (benchmarks keep their CUDA sources in Python strings)."""
    return (_TOKEN if strings else _CODE_TOKEN).findall(_COMMENTS.sub(" ", source))


_TOKEN_HASH: dict[str, int] = {}


def _shingle_hashes(toks: Sequence[str]) -> np.ndarray:
    """One 64-bit hash per distinct 5-token shingle: each token hashed once (blake2b, cached),
    the shingle as a polynomial of its tokens' hashes (mod 2^64): no string per shingle."""
    ids = np.fromiter(
        (
            _TOKEN_HASH.get(t)
            or _TOKEN_HASH.setdefault(
                t, int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little") | 1
            )
            for t in toks
        ),
        dtype=np.uint64,
        count=len(toks),
    )
    if len(ids) < SHINGLE:
        ids = np.concatenate([ids, np.zeros(SHINGLE - len(ids), dtype=np.uint64)])
    width = len(ids) - SHINGLE + 1
    acc = np.zeros(width, dtype=np.uint64)
    for k in range(SHINGLE):
        acc = acc * _M1 + ids[k : k + width]
    return np.unique(acc)


def signature(toks: Sequence[str]) -> np.ndarray:
    """128 minimum hashes of the 5-token shingles. Each permutation is a full 64-bit mix of the
    shingle's hash: a linear (a*x + b) mod p over 32-bit hashes orders the shingles nearly alike
    for every a, which inflated similarities (0.99 estimated for a true 0.87)."""
    x = _shingle_hashes(toks)[:, None] ^ _MASKS[None, :]
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return (x ^ (x >> np.uint64(31))).min(axis=0)


def _rank(row: dict) -> tuple:
    quality = (-(row.get("kill_rate") or 0.0), -row["num_cases"], -row["num_shapes"])
    return (*quality, row.get("order", 0), row["id"])


def shingles(toks: Sequence[str]) -> set[str]:
    return {" ".join(toks[i : i + SHINGLE]) for i in range(max(1, len(toks) - SHINGLE + 1))}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def near_pairs(toks: list[Sequence[str]], threshold: float) -> list[tuple[int, int, float]]:
    """(i, j, similarity) of the pairs at or above `threshold`: MinHash LSH proposes the pairs,
    the exact Jaccard of their shingle sets decides (no estimate noise near the threshold)."""
    sigs = [signature(t) for t in toks]
    buckets: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for i, sig in enumerate(sigs):
        for b in range(BANDS):
            buckets[(b, sig[b * ROWS : (b + 1) * ROWS].tobytes())].append(i)
    proposed = {
        (m[x], m[y])
        for m in buckets.values()
        if len(m) > 1
        for x in range(len(m))
        for y in range(x + 1, len(m))
    }
    sets: dict[int, set[str]] = {}
    found = []
    for i, j in sorted(proposed):
        a = sets.setdefault(i, shingles(toks[i]))
        b = sets.setdefault(j, shingles(toks[j]))
        similarity = jaccard(a, b)
        if similarity >= threshold:
            found.append((i, j, similarity))
    return found


def name_stem(kernel: str) -> str:
    """A kernel's name without the words that mark where it runs (`three_nn_kernel_fast` and
    `three_nn_forward_cuda_kernel` are both `three_nn`)."""
    words = [w for w in kernel.lower().split("_") if w and w not in _PLACE_WORDS]
    return "_".join(words)


def _near(a: dict, b: dict, similarity: float, threshold: float, cross: float) -> bool:
    if similarity >= threshold:
        return True
    if a.get("repo") == b.get("repo"):
        return False  # within one repository, siblings (forward/backward) sit at 0.5-0.9
    same_name = a.get("name") and name_stem(a["name"]) == name_stem(b.get("name", ""))
    return similarity >= cross or bool(same_name and similarity >= SAME_NAME_FLOOR)


def find_duplicates(
    rows: list[dict],
    sources: list[str],
    threshold: float = DEFAULT_THRESHOLD,
    cross: float = CROSS_REPO_THRESHOLD,
) -> dict[int, tuple[int, str, float]]:
    """index of a dropped row → (index of the row kept, "duplicate" | "near_duplicate",
    similarity to it). `sources[i]` is the kernel source of `rows[i]`; `rows[i]` has `repo` and
    `name` (the kernel's) besides what `_rank` reads.

    Rows are taken best first and one is dropped only when it is a copy of a row already kept,
    never of another dropped one: similarity is not transitive, and chaining would let two
    different kernels fall through a third."""
    toks = [tokens(s) for s in sources]
    keys = [hashlib.sha256(" ".join(t).encode()).hexdigest() for t in toks]
    floor = min(threshold, cross, SAME_NAME_FLOOR)
    similar: dict[int, dict[int, float]] = defaultdict(dict)
    for i, j, sim in near_pairs(toks, floor):
        similar[i][j] = similar[j][i] = sim
    by_stem: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        by_stem[name_stem(row.get("name", ""))].append(i)
    for members in by_stem.values():  # same name across repositories: compared even when
        for x, i in enumerate(members):  # MinHash would not propose them (recall ~0.87 at 0.5)
            for j in members[x + 1 :]:
                if j not in similar[i] and rows[i].get("repo") != rows[j].get("repo"):
                    sim = jaccard(shingles(toks[i]), shingles(toks[j]))
                    similar[i][j] = similar[j][i] = sim
    kept: set[int] = set()
    first_key: dict[str, int] = {}
    dropped: dict[int, tuple[int, str, float]] = {}
    for i in sorted(range(len(rows)), key=lambda i: _rank(rows[i])):
        if keys[i] in first_key:
            dropped[i] = (first_key[keys[i]], "duplicate", 1.0)
            continue
        near = [
            (sim, k)
            for k, sim in similar[i].items()
            if k in kept and _near(rows[i], rows[k], sim, threshold, cross)
        ]
        if near:
            sim, k = max(near)
            dropped[i] = (k, "near_duplicate", sim)
            continue
        first_key[keys[i]] = i
        kept.add(i)
    return dropped
