"""The discover stage: every kernel of the repository becomes (or stays) a candidate.

Discovery reads the whole tree at once (seconds for mmcv), so it runs for the repository, not
per candidate: again only when the commit, the size limit or kminer's code changed. A kernel
found again keeps everything later stages did for it; their own keys decide what is stale.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from miner.candidate import Candidate, StageName
from miner.repo_model import to_candidate
from miner.stage import RunContext, Stage


class Discover(Stage):
    name = StageName.DISCOVER
    scope = "repo"

    def key(self, cand: Candidate, ctx: RunContext) -> str:
        blob = f"{self.version()}|{ctx.src.commit}|{ctx.cfg.max_file_bytes}"
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def run(self, batch: list[Candidate], ctx: RunContext) -> Iterator[Candidate]:
        started = False

        def on_file(total: int) -> None:
            nonlocal started
            if not started:
                ctx.progress.start(self.name.value, total)
                started = True
            ctx.progress.advance(self.name.value)

        ctx.discovery = None  # read the tree now, whatever an earlier stage parsed
        disc = ctx.ensure_discovery(on_file)
        if started:
            ctx.progress.end(self.name.value)
        known = {c.id: c for c in batch}
        prov = ctx.provenance
        for fk in disc.kernels:
            found = to_candidate(fk, disc, prov)
            cand = known.get(found.id, found)
            cand.provenance, cand.kernel, cand.launches = prov, found.kernel, found.launches
            cand.set_stage(self.name, found.stage(self.name))
            yield cand
        skips = [(path, reason.value) for path, reason in disc.inventory.skipped]
        ctx.store.replace_file_skips(ctx.repo_id, skips)
        ctx.discovery_info = {
            "files": len(disc.inventory.files),
            "skipped": disc.inventory.skip_counts(),
            "invalid_utf8": len(disc.inventory.invalid_utf8),
            "declarations": disc.declarations,
            "instantiations": disc.instantiations,
            "parse_error_files": len(disc.parse_errors),
        }
        ctx.store.set_discovery(ctx.repo_id, {"info": ctx.discovery_info})
