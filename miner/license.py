"""Find a repository's license as an SPDX id, from its license file or its package metadata.

Every dataset row carries the license of the code it was cut from, so a wrong guess is worse
than "unknown": each rule below needs a phrase that only that license's text contains.
"""

from __future__ import annotations

import configparser
import json
import logging
import re
import tomllib
from pathlib import Path

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
_READ_LIMIT = 256 * 1024

# Every SPDX id kminer knows: (permissive, the Hub's lowercase id or "" when it has none). The
# canonical spelling here is what a stated id is normalized to (case-insensitive lookup); the
# export passes only the permissive ones by default (curation/licenses.py).
SPDX = {
    "Apache-2.0": (True, "apache-2.0"),
    "Apache-1.1": (True, ""),
    "MIT": (True, "mit"),
    "MIT-0": (True, ""),
    "BSD-2-Clause": (True, "bsd-2-clause"),
    "BSD-3-Clause": (True, "bsd-3-clause"),
    "BSD-3-Clause-Clear": (True, "bsd-3-clause-clear"),
    "BSD-4-Clause": (False, ""),
    "0BSD": (True, "0bsd"),
    "ISC": (True, "isc"),
    "Zlib": (True, "zlib"),
    "BSL-1.0": (True, "bsl-1.0"),
    "CC0-1.0": (True, "cc0-1.0"),
    "CC-BY-4.0": (False, "cc-by-4.0"),
    "CC-BY-SA-4.0": (False, "cc-by-sa-4.0"),
    "Unlicense": (True, "unlicense"),
    "MPL-2.0": (False, "mpl-2.0"),
    "MPL-1.1": (False, ""),
    "EPL-1.0": (False, ""),
    "EPL-2.0": (False, "epl-2.0"),
    "GPL-2.0": (False, "gpl-2.0"),
    "GPL-2.0-only": (False, ""),
    "GPL-2.0-or-later": (False, ""),
    "GPL-3.0": (False, "gpl-3.0"),
    "GPL-3.0-only": (False, ""),
    "GPL-3.0-or-later": (False, ""),
    "LGPL-2.0": (False, ""),
    "LGPL-2.1": (False, "lgpl-2.1"),
    "LGPL-2.1-only": (False, ""),
    "LGPL-2.1-or-later": (False, ""),
    "LGPL-3.0": (False, "lgpl-3.0"),
    "LGPL-3.0-only": (False, ""),
    "LGPL-3.0-or-later": (False, ""),
    "AGPL-3.0": (False, "agpl-3.0"),
    "AGPL-3.0-only": (False, ""),
    "AGPL-3.0-or-later": (False, ""),
    "Python-2.0": (False, ""),
    "PSF-2.0": (False, ""),
    "NCSA": (False, ""),
    "Artistic-2.0": (False, ""),
    "WTFPL": (False, ""),
}
PERMISSIVE = frozenset(spdx for spdx, (permissive, _) in SPDX.items() if permissive)
HUB_IDS = {spdx: hub for spdx, (_, hub) in SPDX.items() if hub}
_KNOWN_IDS = {spdx.lower(): spdx for spdx in SPDX}

# (id, pattern) over normalized text (lowercase, punctuation turned into spaces). The earliest
# match in a file wins, so a project license followed by third-party notices reads as the former.
_GNU_TAIL = r"( as published by the free software foundation)?( either)? (version |v)"
_TEXT_RULES: list[tuple[str, str]] = [
    ("AGPL-3.0", r"gnu affero general public license" + _GNU_TAIL + r"3(?![.\d])"),
    ("LGPL-3.0", r"gnu lesser general public license" + _GNU_TAIL + r"3(?![.\d])"),
    ("LGPL-2.1", r"gnu lesser general public license" + _GNU_TAIL + r"2\.1"),
    ("LGPL-2.0", r"gnu library general public license" + _GNU_TAIL + r"2(?![.\d])"),
    ("GPL-3.0", r"gnu general public license" + _GNU_TAIL + r"3(?![.\d])"),
    ("GPL-2.0", r"gnu general public license" + _GNU_TAIL + r"2(?![.\d])"),
    ("Apache-2.0", r"apache license (version |v ?)?2\.0|apache org licenses license 2\.0"),
    ("MPL-2.0", r"mozilla public license (version |v ?)?2\.0"),
    ("BSL-1.0", r"boost software license (version )?1\.0"),
    ("CC0-1.0", r"cc0 1\.0 universal|creative commons legal code cc0"),
    ("Unlicense", r"this is free and unencumbered software released into the public domain"),
    ("Zlib", r"this software is provided as is without any express or implied warranty"),
    (
        "ISC",
        r"permission to use copy modify and( or)? distribute this software for any purpose "
        r"with or without fee is hereby granted provided that the above copyright notice",
    ),
    ("MIT", r"permission is hereby granted free of charge to any person obtaining a copy"),
    (
        "BSD",
        r"redistribution and use in source and binary forms with or without modification "
        r"are permitted provided that",
    ),
]
_TEXT_RES = [(spdx, re.compile(pat)) for spdx, pat in _TEXT_RULES]

# (id, pattern) over a normalized license *name* from metadata or a classifier; anchored.
_NAME_RULES: list[tuple[str, str]] = [
    ("MIT", r"(the )?mit( license)?|expat( license)?"),
    ("Apache-2.0", r"(the )?apache( software)?( license)?( version| v)?( 2| 2.0)?|asl 2.0|apache2"),
    (
        "BSD-3-Clause",
        r"(the )?(new |modified |revised )?bsd( license)?|bsd 3 clause( license)?|"
        r"3 clause bsd( license)?|bsd 3",
    ),
    (
        "BSD-2-Clause",
        r"(simplified|freebsd) bsd( license)?|bsd 2 clause( license)?|"
        r"2 clause bsd( license)?|bsd 2",
    ),
    ("AGPL-3.0", r"(gnu )?(affero general public license|agpl) ?(v3|version 3|3)( or later)?"),
    ("LGPL-3.0", r"(gnu )?(lesser general public license|lgpl) ?(v3|version 3|3)( or later)?"),
    (
        "LGPL-2.1",
        r"(gnu )?(lesser general public license|lgpl) ?(v2.1|version 2.1|2.1)"
        r"( or later)?",
    ),
    ("GPL-3.0", r"(gnu )?(general public license|gpl) ?(v3|version 3|3)( or later)?"),
    ("GPL-2.0", r"(gnu )?(general public license|gpl) ?(v2|version 2|2)( or later)?"),
    ("MPL-2.0", r"(mozilla public license|mpl) ?(2.0|v2|v2.0|version 2.0)"),
    ("ISC", r"isc( license)?"),
    ("BSL-1.0", r"(boost software license|boost|bsl)( 1.0)?"),
    ("CC0-1.0", r"cc0( 1.0)?( universal)?"),
    ("Unlicense", r"(the )?unlicense"),
    ("Zlib", r"zlib( libpng)?( license)?"),
]
_NAME_RES = [(spdx, re.compile(pat)) for spdx, pat in _NAME_RULES]

_SPDX_LINE = re.compile(r"SPDX-License-Identifier:\s*([^\r\n]+)")
_SPDX_TOKEN = re.compile(r"[A-Za-z0-9.+-]+|\(|\)")
_CLASSIFIER = re.compile(r"License :: (?:OSI Approved :: )?([^'\"\n]+)")
_SETUP_PY_LICENSE = re.compile(r"""\blicense\s*=\s*(['"])(.+?)\1""")


def detect_license(root: Path) -> tuple[str, str]:
    """Return (SPDX id or "unknown", path of the file it came from relative to root, or "").

    Why: provenance needs a license per row; license files are trusted first, then package
    metadata (read as text, never executed). Anything ambiguous stays "unknown".
    """
    root = Path(root)
    found = [
        (name, spdx)
        for name in _license_files(root)
        if (spdx := _from_text(_read(root / name))) != UNKNOWN
    ]
    if found:
        # COPYING (GPL text) next to COPYING.LESSER (LGPL) is how LGPL projects ship.
        lesser = [f for f in found if f[1].startswith("LGPL")]
        name, spdx = lesser[0] if lesser and all("GPL" in s for _, s in found) else found[0]
        return spdx, name
    for name, reader in (
        ("pyproject.toml", _pyproject),
        ("setup.cfg", _setup_cfg),
        ("setup.py", _setup_py),
        ("package.json", _package_json),
    ):
        path = root / name
        if path.is_file():
            try:
                spdx = reader(path, root)
            except (OSError, ValueError, configparser.Error) as exc:
                log.debug("cannot read %s: %s", path, exc)
                continue
            if spdx != UNKNOWN:
                return spdx, name
    return UNKNOWN, ""


def spdx_from_name(name: str) -> str:
    """Map a license name as people write it ("Apache License 2.0", "BSD") to an SPDX id.

    Why: package metadata holds free text; only names that mean one license are mapped.
    """
    name = name.strip()
    if expr := _spdx_expression(name):
        return expr
    # "GNU General Public License v3 (GPLv3)": the part in parentheses only repeats the name.
    norm = _normalize(re.sub(r"\(.*?\)", " ", name)) or _normalize(name)
    norm = re.sub(r" licen[cs]e$", "", norm.replace("licence", "license"))
    for spdx, pat in _NAME_RES:
        if pat.fullmatch(norm):
            return spdx
    if len(name) > 200:  # a whole license text pasted into a metadata field
        return _from_text(name)
    return UNKNOWN


def _license_files(root: Path) -> list[str]:
    """License-looking files in root, best first: LICENSE/LICENCE, UNLICENSE, COPYING, LICENSE-*."""
    try:
        names = [p.name for p in root.iterdir() if p.is_file()]
    except OSError:
        return []

    def rank(name: str) -> int | None:
        low = name.lower()
        stem, _, ext = low.partition(".")
        if stem in ("license", "licence") and ext in ("", "txt", "md", "rst"):
            return 0
        if stem == "unlicense":
            return 1
        if low.startswith("copying"):
            return 2
        if low.startswith(("license", "licence")):
            return 3
        return None

    ranked = sorted((r, n) for n in names if (r := rank(n)) is not None)
    return [n for _, n in ranked]


def _read(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(_READ_LIMIT).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _normalize(text: str) -> str:
    """Lowercase words; keep dots only inside numbers ("2.0") so phrases match across wrapping."""
    text = text.lower().replace("\u2019", "'")
    text = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", text)
    return re.sub(r"[^a-z0-9.]+", " ", text).strip()


def _spdx_expression(value: str) -> str:
    """Canonical form of an SPDX id or expression ("mit OR apache-2.0"), or "" if it is not one."""
    tokens = _SPDX_TOKEN.findall(value)
    if not tokens or "".join(tokens) != re.sub(r"\s+", "", value):
        return ""
    out = []
    for tok in tokens:
        if tok.upper() in ("AND", "OR", "WITH") and out:
            out.append(tok.upper())
        elif tok in "()" or tok.startswith(("LicenseRef-", "DocumentRef-")):
            out.append(tok)
        elif tok.lower() in _KNOWN_IDS:
            out.append(_KNOWN_IDS[tok.lower()])
        elif out and out[-1] == "WITH":
            out.append(tok)  # exception ids, e.g. LLVM-exception
        else:
            return ""
    return " ".join(out).replace("( ", "(").replace(" )", ")")


def _from_text(text: str) -> str:
    """Identify a license from its full text or an SPDX-License-Identifier line."""
    if m := _SPDX_LINE.search(text):
        value = re.sub(r"\s*(\*/|-->|#}|%>)\s*$", "", m.group(1)).strip()
        if expr := _spdx_expression(value):
            return expr
    norm = _normalize(text)
    hits = [(m.start(), spdx) for spdx, pat in _TEXT_RES if (m := pat.search(norm))]
    if not hits:
        return UNKNOWN
    _, spdx = min(hits)
    if spdx == "BSD":
        if "all advertising materials mentioning features" in norm:
            return "BSD-4-Clause"
        endorse = re.search(
            r"(neither the name|names? of (its|the) contributors) .{0,160}?"
            r"(endorse|promote)",
            norm,
        )
        return "BSD-3-Clause" if endorse else "BSD-2-Clause"
    if spdx == "Zlib" and "altered source versions must be plainly marked" not in norm:
        return UNKNOWN
    return spdx


def _inside(root: Path, rel: str) -> Path | None:
    path = (root / rel).resolve()
    return path if path.is_relative_to(root.resolve()) and path.is_file() else None


def _pyproject(path: Path, root: Path) -> str:
    data = tomllib.loads(_read(path))
    project = data.get("project", {})
    lic = project.get("license")
    if isinstance(lic, str):
        return spdx_from_name(lic)
    if isinstance(lic, dict):
        if isinstance(lic.get("text"), str):
            return spdx_from_name(lic["text"])
        if isinstance(lic.get("file"), str) and (target := _inside(root, lic["file"])):
            return _from_text(_read(target))
    poetry = data.get("tool", {}).get("poetry", {}).get("license")
    if isinstance(poetry, str):
        return spdx_from_name(poetry)
    return _from_classifiers(project.get("classifiers") or [])


def _setup_cfg(path: Path, root: Path) -> str:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(_read(path))
    if cfg.has_option("metadata", "license"):
        spdx = spdx_from_name(cfg.get("metadata", "license"))
        if spdx != UNKNOWN:
            return spdx
    classifiers = cfg.get("metadata", "classifiers", fallback="")
    return _from_classifiers(classifiers.splitlines())


def _setup_py(path: Path, root: Path) -> str:
    text = _read(path)
    if (m := _SETUP_PY_LICENSE.search(text)) and (spdx := spdx_from_name(m.group(2))) != UNKNOWN:
        return spdx
    return _from_classifiers(_CLASSIFIER.findall(text), prefixed=False)


def _package_json(path: Path, root: Path) -> str:
    data = json.loads(_read(path))
    lic = data.get("license") if isinstance(data, dict) else None
    if isinstance(lic, dict):
        lic = lic.get("type")
    if not lic and isinstance(data, dict) and isinstance(data.get("licenses"), list):
        types = [x.get("type") for x in data["licenses"] if isinstance(x, dict)]
        lic = types[0] if len(types) == 1 else None
    return spdx_from_name(lic) if isinstance(lic, str) else UNKNOWN


def _from_classifiers(classifiers: list[str], prefixed: bool = True) -> str:
    """One distinct license among trove classifiers ("License :: OSI Approved :: MIT License")."""
    names = []
    for c in classifiers:
        if prefixed:
            m = _CLASSIFIER.search(c)
            c = m.group(1) if m else ""
        if c.strip():
            names.append(spdx_from_name(c.strip()))
    ids = set(names)
    return ids.pop() if len(ids) == 1 else UNKNOWN
