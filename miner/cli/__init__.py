"""The `kminer` command line (app.py assembles it; `kminer` runs `miner.cli.app:main`)."""
