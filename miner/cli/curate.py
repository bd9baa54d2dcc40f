"""`kminer curator add|list|revoke`, `serve`, `export` and `publish`: the curators' commands.

`curator add` prints the token once, as the last word of its last line (scripts take it with
`| tail -1 | awk '{print $NF}'`); the store keeps only its hash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from curation import curators
from miner.cli.common import (
    AttemptsOpt,
    BaseUrlOpt,
    DbOpt,
    LlmOpt,
    ModelOpt,
    WorkdirOpt,
    bounded,
    fail,
    listening_socket,
    llm_mode,
    open_store,
    out,
)

curator_app = typer.Typer(
    no_args_is_help=True, help="Curators of the review queue and their tokens."
)


@curator_app.command("add")
def curator_add(
    name: Annotated[str, typer.Argument(help="The curator's name (shown in the audit trail).")],
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
) -> None:
    """Add a curator and print their token (once: only its hash is kept)."""
    store = open_store(workdir, db)
    try:
        token = curators.add(store, name)
    except curators.CuratorError as exc:
        raise fail(str(exc)) from None
    finally:
        store.close()
    out.print(f"curator {name} added; keep this token, it is not shown again:", highlight=False)
    print(f"token: {token}")


@curator_app.command("list")
def curator_list(workdir: WorkdirOpt = None, db: DbOpt = None) -> None:
    """The curators, and when each was added or revoked."""
    store = open_store(workdir, db)
    rows = curators.listing(store)
    store.close()
    for r in rows:
        state = f"revoked {r['revoked_at']:%Y-%m-%d %H:%M}" if r["revoked_at"] else "active"
        out.print(
            f"{r['name']:24} added {r['created_at']:%Y-%m-%d %H:%M}  {state}", highlight=False
        )
    if not rows:
        out.print("no curators (kminer curator add NAME)")


@curator_app.command("revoke")
def curator_revoke(name: str, workdir: WorkdirOpt = None, db: DbOpt = None) -> None:
    """Revoke a curator's token; their sessions end, their audit rows stay."""
    store = open_store(workdir, db)
    try:
        curators.revoke(store, name)
    except curators.CuratorError as exc:
        raise fail(str(exc)) from None
    finally:
        store.close()
    out.print(f"curator {name} revoked", highlight=False)


def serve(
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Port to listen on.", callback=bounded(1, 65535))
    ] = 8000,
    public_read: Annotated[
        bool, typer.Option("--public-read", help="Let anyone read; writes still need a curator.")
    ] = False,
) -> None:
    """Serve the review UI and its JSON API on the workdir's store."""
    import uvicorn

    from curation.server import create_app

    store = open_store(workdir, db)
    try:  # bound before the app adds its tables: a refused address leaves the store as it was
        sock = listening_socket(host, port)
    except typer.Exit:
        store.close()
        raise
    app = create_app(store, public_read=public_read, workdir=(workdir or Path(".")).resolve())
    out.print(f"kminer review on http://{host}:{port}/", highlight=False)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn.run's behaviour: Ctrl-C ends the server quietly
        pass
    finally:
        sock.close()


def export(
    workdir: Annotated[
        list[Path],
        typer.Option(
            "--workdir",
            "-w",
            help="A workdir to export (repeat for several: duplicates are found across all).",
        ),
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="The dataset folder to write.")],
    allow_license: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-license",
            help="Also export rows under this SPDX id (repeat; `unknown` allowed).",
        ),
    ] = None,
    exclude: Annotated[
        list[Path] | None,
        typer.Option(
            "--exclude",
            help="A file or folder of "
            "sources (a benchmark's kernels) whose n-grams keep a row out.",
        ),
    ] = None,
    exclude_overlap: Annotated[
        float, typer.Option(help="Share of a kernel's 10-grams found in --exclude that drops it.")
    ] = 0.5,
    near_dup_threshold: Annotated[
        float,
        typer.Option(help="Jaccard (5-token shingles) at which two kernels are near duplicates."),
    ] = 0.85,
    cross_repo_threshold: Annotated[
        float, typer.Option(help="The same, for kernels of two different repositories.")
    ] = 0.7,
    source: Annotated[
        list[str] | None,
        typer.Option(
            "--source",
            help="PATH=URL: the public URL of a repository mined from a local path (repeat).",
        ),
    ] = None,
    shard_rows: Annotated[int, typer.Option(help="Rows per Parquet shard.")] = 1000,
    include_overrides: Annotated[
        bool,
        typer.Option(
            "--include-overrides",
            help="Also export rows a curator accepted without a GPU pass with every wrong "
            "variant killed (`verification`: override); left out by default.",
        ),
    ] = False,
    llm: LlmOpt = None,
    model: ModelOpt = None,
    llm_base_url: BaseUrlOpt = None,
    max_attempts: AttemptsOpt = 3,
) -> None:
    """Export accepted candidates as a Hugging Face dataset folder (Parquet, card, JSONL)."""
    from curation.export import ExportError, Options
    from curation.export import export as run_export
    from miner.cli.common import say

    sources = {}
    for item in source or []:
        local, sep, url = item.partition("=")
        if not sep or not local or not url:
            raise fail(f"--source {item!r}: expected PATH=URL", 2)
        sources[local] = url
    describe_with = None
    if llm_mode(llm, llm_base_url) == "openai":
        from wrappers.llm.client import client_from_env

        def describe_with(store):
            return client_from_env(store, base_url=llm_base_url, model=model)

    opts = Options(
        workdirs=workdir,
        out=out_dir,
        allow_license=allow_license or [],
        exclude=exclude or [],
        overlap=exclude_overlap,
        threshold=near_dup_threshold,
        cross_threshold=cross_repo_threshold,
        sources=sources,
        shard_rows=max(1, shard_rows),
        describe_with=describe_with,
        max_attempts=max_attempts,
        include_overrides=include_overrides,
    )
    try:  # an empty export is an ExportError too: OUT is left as it was, the line says why
        report = run_export(opts, progress=say)
    except ExportError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:  # a missing --exclude source, a folder that cannot be written
        raise fail(f"export failed, {out_dir} left as it was: {exc}") from None
    dropped = ", ".join(f"{k} {n}" for k, n in report["dropped"].items()) or "none"
    say(
        f"{report['rows']} rows exported to {out_dir} from {report['accepted']} accepted "
        f"(left out: {dropped}) in {report['seconds']:.1f} s"
    )


def publish(
    folder: Annotated[Path, typer.Argument(help="A folder written by `kminer export`.")],
    repo_id: Annotated[str, typer.Option("--repo-id", help="OWNER/NAME on the Hub.")],
    private: Annotated[
        bool, typer.Option("--private", help="Create the repository private.")
    ] = False,
    revision: Annotated[str | None, typer.Option("--revision", help="Branch to push to.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the operations, push nothing.")
    ] = False,
) -> None:
    """Push an exported dataset to the Hugging Face Hub (token: HF_TOKEN or a saved login)."""
    from curation.publish import PublishError, plan
    from curation.publish import publish as push

    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise fail(f"--repo-id {repo_id!r}: expected OWNER/NAME", 2)
    try:
        if dry_run:
            for line in plan(folder, repo_id, private, revision):
                print(line)
            return
        url = push(folder, repo_id, private=private, revision=revision)
    except PublishError as exc:
        raise fail(str(exc)) from None
    except Exception as exc:  # the Hub's errors, an unreadable shard: one line
        first = (str(exc).splitlines() or [""])[0]
        raise fail(f"publish failed: {type(exc).__name__}: {first}") from None
    out.print(f"published {folder} to {url}", highlight=False, markup=False)
