"""Which licenses a row may be exported under.

By default only permissive licenses pass: a dataset row is a copy of the code, and users train
on it without tracking per-row obligations. `--allow-license ID` adds more (a copyleft id, or
`unknown` for a local export that will not be shared: publish refuses unknown licenses anyway).
The Hub's card header wants its own lowercase ids; an SPDX id it does not list becomes `other`.
"""

from __future__ import annotations

from miner.license import HUB_IDS, PERMISSIVE, UNKNOWN


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
    return sorted({HUB_IDS.get(i, "other") for i in base})
