"""Which licenses a row may be exported under.

By default only permissive licenses pass: a dataset row is a copy of the code, and users train
on it without tracking per-row obligations. `--allow-license ID` adds more (a copyleft id, or
`unknown` for a local export that will not be shared: publish refuses unknown licenses anyway).
The Hub's card header wants its own lowercase ids; an SPDX id it does not list becomes `other`.
"""

from __future__ import annotations

PERMISSIVE = frozenset(
    {
        "MIT",
        "MIT-0",
        "Apache-2.0",
        "Apache-1.1",
        "BSD-2-Clause",
        "BSD-3-Clause",
        "BSD-3-Clause-Clear",
        "0BSD",
        "ISC",
        "Zlib",
        "BSL-1.0",
        "CC0-1.0",
        "Unlicense",
    }
)
UNKNOWN = "unknown"
_HUB_IDS = {
    "Apache-2.0": "apache-2.0",
    "MIT": "mit",
    "BSD-2-Clause": "bsd-2-clause",
    "BSD-3-Clause": "bsd-3-clause",
    "BSD-3-Clause-Clear": "bsd-3-clause-clear",
    "0BSD": "0bsd",
    "ISC": "isc",
    "Zlib": "zlib",
    "BSL-1.0": "bsl-1.0",
    "CC0-1.0": "cc0-1.0",
    "Unlicense": "unlicense",
    "GPL-2.0": "gpl-2.0",
    "GPL-3.0": "gpl-3.0",
    "LGPL-2.1": "lgpl-2.1",
    "LGPL-3.0": "lgpl-3.0",
    "AGPL-3.0": "agpl-3.0",
    "MPL-2.0": "mpl-2.0",
    "EPL-2.0": "epl-2.0",
    "CC-BY-4.0": "cc-by-4.0",
    "CC-BY-SA-4.0": "cc-by-sa-4.0",
}


def allowed(allow: list[str] | None) -> frozenset[str]:
    extra = {a.strip() for a in allow or [] if a.strip()}
    return PERMISSIVE | {a.lower() if a.lower() == UNKNOWN else a for a in extra}


def drop_reason(license_id: str, allow: frozenset[str]) -> str:
    """'' when a row under `license_id` may be exported, else why not."""
    if license_id in allow:
        return ""
    if license_id == UNKNOWN:
        return "license unknown (--allow-license unknown to export it anyway)"
    return f"license {license_id} is not permissive (--allow-license {license_id} to export it)"


def hub_ids(license_ids: list[str]) -> list[str]:
    """The card's `license:` values for the rows' SPDX ids."""
    base = {i.removesuffix("-only").removesuffix("-or-later") for i in license_ids}
    return sorted({_HUB_IDS.get(i, "other") for i in base})
