"""`python -m miner.cli`: the same as the `kminer` command."""

from miner.cli.app import main

main()
