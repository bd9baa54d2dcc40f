"""Scripts kminer runs as processes of their own, never inside its own process.

The runner (a bundle's `run.py`) and its batched builds go to a GPU box that has python, torch
and pytest and nothing of kminer; the recorder and the checkers run repository or model code
in the sandbox. So these files import only the standard library, torch and pytest, and each
other as siblings (`from testgen.standalone import prebuild` here, `import prebuild` beside
run.py in a bundle). Four kminer files travel with them and keep the same rule:
wrappers/batching.py, miner/toolchain.py, miner/sandbox.py and miner/supervisor.py (the execution
boundary every run of code kminer did not write goes through).
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "runner.py"  # a bundle's run.py
PREBUILD = HERE / "prebuild.py"  # run.py's batched builds
RECORDER = HERE / "recorder.py"  # a repository's test file, its extension calls recorded
RECORDER_PARTS = (  # its sibling modules
    HERE / "record_log.py",
    HERE / "record_objects.py",
    HERE / "record_rows.py",
    HERE / "pretend_cuda.py",
    HERE / "inline_refs.py",
)
CALLCHECK = HERE / "callcheck.py"  # a model's make_calls, checked
REFCHECK = HERE / "refcheck.py"  # a model's reference, checked
REFRUN = HERE / "refrun.py"  # a reference kminer assembled, run for its outputs
PROBE = HERE / "probe.py"  # drafted calls, through a CPU implementation built with ASan
SETUPCAPTURE = HERE / "setupcapture.py"  # a repository's setup.py, run for its extensions
