"""Tests that compare each kernel with a CPU reference on the GPU, and catch wrong kernels.

The pieces and the contract between them (every module relies on it):

- `llm_reference` (with an endpoint, where the repository has no CPU function): `references/
  <id>.py`, a PyTorch `reference` with the same parameters, checked in the sandbox on the
  recorded calls (`standalone/refcheck.py`); the test loads it instead of building C++ (kind
  llm, or python when it adapts one of the repository's own PyTorch functions).
- `python_reference` / `vendor`: the repository's PyTorch function its tests compare the op
  with, copied with what it needs (einops' rearrange/repeat by kminer's plain-torch stand-in,
  `einops_lite`).
- `reference`: the repository's CPU implementation of the same op, extracted into a standalone
  C++ source (`references/<id>.cpp` in the workdir) that builds with `cpp_extension` next to the
  label and exposes `reference` with the *same Python signature as the label's first exposed
  function* (the mined launcher), so a test calls both with the same arguments.
- `inputs` / `made_inputs` / `llm_inputs`: the base calls of the host function (launcher parameter
  order, CPU tensors and Python values). First the repository's own tests, recorded in the sandbox
  and carried down the op chain; else, for an element-wise rule wrapper or a host function
  that uses each tensor as n elements (`elementwise`), calls by rule; else (with
  an endpoint) the model's `make_calls`, run in the sandbox (`callcheck`: >= 3 calls over >= 3
  shapes, values of each parameter's kind, seeded); a backward the tests never call gets calls
  made from its forward's (`backward_calls`); an op no test calls, the calls of an op of the
  same extension that takes the same parameters and returns its result (`sibling_calls`); an
  op with a C++ CPU implementation, calls drafted from its signature and kept where that
  implementation, built with AddressSanitizer, runs them clean (`probe_inputs`, before the model).
  Stage metric `cases_source`: mined|forward|cpu_branch|sibling|rule|probe|llm.
  The repository's tests run under `standalone/recorder.py`, in the sandbox; `carry` takes a
  recorded call of the Python binding down the op chain to the label's function.
- `cases`: the plan over the base calls (fewer rows, a larger drawn case, a boolean mode the
  recorded calls never vary, a string mode set on a kind of shape it was never recorded with,
  edge values, wider channels, every dtype), embedded in the test with `torch.save`.
- `wrappers/llm/turns.py`: the ask, check, feed-back loop both model steps share; every answer an
  attempt row (step `reference` or `inputs`).
- `testcode`: renders the standalone pytest file (the dataset row's `test_code`) from
  `prompts/test_code.py.j2`. Only python + torch + pytest are needed to run it. Environment:
    KMINER_IMPL       the .cu under test (default: `label.cu` beside the test file)
    KMINER_REFERENCE  the reference .cpp or .py (default: `reference.cpp`/`.py` beside the test)
    KMINER_BUILD_DIR  where torch extensions are built and cached (default: a temp dir)
    KMINER_REPORT     a JSON file the test writes its report to (optional)
    KMINER_PHASE      `build` (only build + import both modules) or `run` (default: both)
    KMINER_PREBUILT   a folder of `<sha256(source)[:16]>.json` files, one per module the runner
                      built many to one extension (standalone/prebuild.py); a test imports the
                      module of exactly the bytes it would build, else builds it itself
    KMINER_GPU_LOCK   a lock file when the runner shares a GPU between tests: cases hold it
                      shared, the kernel timing alone
    KMINER_TIMING     `0`: no kernel timing (a wrong variant's run)
  A differing case is excused only when a rerun differs: on the GPU the label runs twice on
  memory filled with two different bytes, so a kernel that leaves its output unwritten repeats
  itself and is judged by its mismatch, not excused as nondeterministic.
  The report: {"phase", "outcome": pass|mismatch|build_error|import_error,
  "cases": [{"id", "shape", "dtype", "max_abs", "max_rel", "ok"}], "kernel_time_us", "gpu",
  "torch", "cuda", "error"}. A crash or a hang leaves the report without an outcome; the runner
  tells them apart by the exit signal and its timeout.
- `variants`: wrong versions of a label (output never written, off-by-one, operator swapped),
  best first within each kind; the test must fail one of each kind it can build. A variant it
  passes may be equivalent to the label, so the next of its kind stands in; a kind it never
  fails makes the outcome `weak_test`, as do fewer valid cases or shapes than the manifest asks.
- `generate`: one candidate's reference, cases, variants and test; `testgen_stage`: the stage
  over a run's candidates (the recorder runs once per run).
- `standalone/runner.py` / `bundle`: one subprocess per candidate and per variant, build and run
  timed out separately, outcomes collected into results.json; a bundle carries it all to a GPU
  box; `verify_stage` runs the same bundle in place on a machine with a GPU.
"""
