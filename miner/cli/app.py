"""The `kminer` command line: the app, and every command registered on it, here, in one list.

Command modules (mine.py, verify.py, curate.py) never import this one; it imports them. Usage
errors, like every other error of kminer, are one red line and a non-zero exit.
"""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from miner.cli import curate, mine, verify
from miner.cli.common import fail, out


class _OneLineErrors(TyperGroup):
    """Usage errors as one red line too, like every other error of kminer.

    typer vendors its own click, so exceptions are recognised by name and shape."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except Exception as exc:
            kind = type(exc).__name__
            if kind == "Exit":
                sys.exit(exc.exit_code)
            if kind == "NoArgsIsHelp":
                ctx = getattr(exc, "ctx", None)
                out.print(ctx.get_help() if ctx else str(exc))
                sys.exit(0)
            if kind == "Abort":
                fail("aborted")
                sys.exit(130)
            if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
                fail(" ".join(exc.format_message().split()))
                sys.exit(exc.exit_code)
            raise
        # without standalone mode click hands back the code of typer.Exit instead of exiting
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    help="Mine CUDA kernels from a repository into standalone, tested dataset rows.",
)
COMMANDS = (
    mine.mine,
    mine.wrap,
    mine.build,
    mine.testgen,
    mine.candidates,
    mine.stats,
    verify.bundle,
    verify.ingest,
    verify.verify,
    curate.serve,
    curate.export,
    curate.publish,
)
for command in COMMANDS:
    app.command()(command)
app.add_typer(curate.curator_app, name="curator")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
