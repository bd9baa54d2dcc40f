"""`kminer curator add|list|revoke` and `kminer serve`, registered on miner.cli's app.

`curator add` prints the token once, as the last word of its last line (scripts take it with
`| tail -1 | awk '{print $NF}'`); the store keeps only its hash.
"""

from __future__ import annotations

from typing import Annotated

import typer

from miner.cli import DbOpt, WorkdirOpt, _fail, _open_store, app, out

curator_app = typer.Typer(
    no_args_is_help=True, help="Curators of the review queue and their tokens."
)
app.add_typer(curator_app, name="curator")


@curator_app.command("add")
def curator_add(
    name: Annotated[str, typer.Argument(help="The curator's name (shown in the audit trail).")],
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
) -> None:
    """Add a curator and print their token (once: only its hash is kept)."""
    from curation import curators

    store = _open_store(workdir, db)
    try:
        token = curators.add(store, name)
    except curators.CuratorError as exc:
        raise _fail(str(exc)) from None
    finally:
        store.close()
    out.print(f"curator {name} added; keep this token, it is not shown again:", highlight=False)
    print(f"token: {token}")


@curator_app.command("list")
def curator_list(workdir: WorkdirOpt = None, db: DbOpt = None) -> None:
    """The curators, and when each was added or revoked."""
    from curation import curators

    store = _open_store(workdir, db)
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
    from curation import curators

    store = _open_store(workdir, db)
    try:
        curators.revoke(store, name)
    except curators.CuratorError as exc:
        raise _fail(str(exc)) from None
    finally:
        store.close()
    out.print(f"curator {name} revoked", highlight=False)


@app.command()
def serve(
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    public_read: Annotated[
        bool, typer.Option("--public-read", help="Let anyone read; writes still need a curator.")
    ] = False,
) -> None:
    """Serve the review UI and its JSON API on the workdir's store."""
    import uvicorn

    from curation.server import create_app

    store = _open_store(workdir, db)
    out.print(f"kminer review on http://{host}:{port}/", highlight=False)
    uvicorn.run(
        create_app(store, public_read=public_read), host=host, port=port, log_level="warning"
    )
