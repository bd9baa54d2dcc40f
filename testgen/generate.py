"""One candidate's test: a CPU reference, cases, wrong variants and the standalone test_code.

Everything here runs on this machine without a GPU and without running repository code outside
the sandbox (the repository's tests are run by the recorder, in the sandbox). The GPU part is
`kminer verify` or a bundle. A candidate without a reference or without cases is `skipped` with
its reason (not a failure: it waits for an LLM reference or generated inputs).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from miner.candidate import Candidate, Reason, Reference, StageName, StageResult, Status, Tests
from testgen.backward_calls import backward_calls
from testgen.behind_forward import behind_forward
from testgen.caller_sorts import caller_sorts
from testgen.carry import Unmappable, carry_down, public_names
from testgen.cases import (
    MIN_CASES,
    MIN_SHAPES,
    BaseCall,
    base_calls,
    binding_variants,
    label_dtypes,
    plan,
)
from testgen.driver_twin import driver_reference
from testgen.grad_reference import find_grad_reference
from testgen.kernel_outputs import unchecked
from testgen.llm_inputs import write_llm_calls
from testgen.llm_reference import write_llm_reference
from testgen.made_inputs import (
    ELEMENTWISE_ORIGIN,
    RULE_ORIGIN,
    elementwise_calls,
    exposed_params,
    exposed_signature,
    label_signature,
    rule_calls,
)
from testgen.probe_inputs import PROBE_ORIGIN, probed_calls
from testgen.python_branch import cuda_calls
from testgen.python_reference import CHECK_TIMEOUT_S, find_python_reference
from testgen.rank_variants import rank_choices
from testgen.reach import dead_spans, kernel_scalars
from testgen.reference import find_reference
from testgen.sandbox import run_checker
from testgen.selectors import kernel_selectors
from testgen.shape_selectors import shape_selectors
from testgen.sibling_calls import sibling_calls
from testgen.standalone import REFCHECK
from testgen.standalone.record_log import MAX_ELEMENTS as RECORDED_ELEMENTS
from testgen.testcode import order_free_reason, render_test
from testgen.tile_sizes import tile_sizes
from testgen.variants import VariantKind, derive_variants
from wrappers.through_forward import is_backward

log = logging.getLogger(__name__)


@dataclass
class ModelHelp:
    """A model's help where the repository has no reference or no inputs (`--llm`)."""

    client: object  # wrappers.llm.client.LLMClient
    store: object  # miner.store.Store: the client's cache and the attempt rows
    max_attempts: int = 3


VARIANTS_PER_KIND = 3  # the best of each kind, then alternates for one that survives or fails
MAX_TWIN_CALLS = 16  # recorded calls of a CPU twin binding taken as calls of the CUDA one


def _backward_on_chain(cand: Candidate, recorded, refs, python_fn: str):
    """Launcher calls made from the forward's recorded calls for a backward function on the
    label's chain below the public op (pytorch_spline_conv: `spline_basis` is the op, its C++
    autograd Function calls `spline_basis_bw` from `backward`, which no test reaches); None
    when there is none."""
    chain = cand.wrapper.op_map.get("chain") or []
    for name in reversed(chain):
        if name == python_fn or not is_backward(name):
            continue
        derived = backward_calls(name, recorded, refs)
        if isinstance(derived, list):
            base, _ = base_calls(cand, derived, refs)
            if base:
                return base, "forward"
    return None


def _skip(cand: Candidate, reason: Reason, detail: str, **metrics) -> None:
    cand.tests = Tests()  # a test an earlier run wrote is not this run's
    cand.set_stage(
        StageName.TESTGEN,
        StageResult(status=Status.SKIPPED, reason=reason, detail=detail[:300], metrics=metrics),
    )


def _too_big(recorded, names: list[str], calls: list) -> str:
    """Why the tests' calls of the op are missing when the recorder dropped them for their
    size (a test at production size: Swin's window ops take 192 x 56 x 56 x 96), first in a
    detail that the rest would otherwise cut off; "" when it kept some or dropped none."""
    too_big = getattr(recorded, "too_big", {})  # (a plain dict of calls: none dropped)
    largest = max((too_big.get(n, 0) for n in names), default=0)
    if calls or not largest:
        return ""
    return (
        f"the repository's tests call it only with tensors too large to record "
        f"({largest / 1e6:.1f} M elements; at most {RECORDED_ELEMENTS / 1e6:.1f} M); "
    )


def _dead_branches(cand: Candidate, label_text: str, function: str, params, base) -> list:
    """Spans of the kernel that no base call reaches (a mode no recorded call uses)."""
    kernel_params = [p.name for p in cand.kernel.params]
    dead: set[tuple[int, int]] | None = None
    for b in base:
        values = dict(zip(params or [], b.args, strict=False))
        known = kernel_scalars(label_text, cand.kernel.name, function, kernel_params, values)
        spans = set(dead_spans(label_text, cand.kernel.name, known))
        dead = spans if dead is None else dead & spans
    return sorted(dead or ())


def _write_variants(
    cand: Candidate, label_text: str, workdir: Path, dead: list
) -> tuple[list, list]:
    picked: dict[VariantKind, int] = {}
    paths, kinds = [], []
    folder = workdir / "variants"
    folder.mkdir(exist_ok=True)
    for old in folder.glob(f"{cand.id}.*"):  # a previous test's variants
        old.unlink()
    for v in derive_variants(label_text, cand.kernel.name, dead):
        if picked.get(v.kind, 0) >= VARIANTS_PER_KIND:
            continue
        picked[v.kind] = picked.get(v.kind, 0) + 1
        path = folder / f"{cand.id}.{len(paths)}.{v.kind.value}.cu"
        path.write_text(v.text, encoding="latin-1", errors="replace")
        paths.append(str(path.relative_to(workdir)))
        kinds.append(v.kind.value)
    return paths, kinds


def _llm_reference(cand, refs, base, label_text: str, sig, llm, workdir: Path):
    """The model's reference (testgen/llm_reference.py), or why there is none."""
    if sig is None:
        return "llm: the host function has no signature to write a reference for"
    return write_llm_reference(
        cand,
        label_text,
        sig,
        [b.args for b in base],
        client=llm.client,
        store=llm.store,
        workdir=workdir,
        repo_root=Path(refs.disc.root),
        max_attempts=llm.max_attempts,
    )


def _made_calls(cand, label_text: str, sig, found, llm, workdir: Path) -> tuple[list, str, str]:
    """(base calls, cases_source, who made them) when the repository's tests never call the
    op: by rule, else by the model; ([], "", why) when neither can."""
    if sig is None:
        return [], "", "the host function has no signature to make inputs for"
    made = rule_calls(cand, sig)
    if made:
        return made, "rule", RULE_ORIGIN
    function = (cand.wrapper.functions or [cand.wrapper.launcher])[0]
    made = elementwise_calls(sig, label_text, function)
    if made:
        return made, "rule", ELEMENTWISE_ORIGIN
    probed = ""
    if not isinstance(found, str) and found.kind == "cpp":  # the CPU code knows the contract
        reference = workdir / found.path
        reference_text = reference.read_text("latin-1")
        bound = label_signature("reference", reference_text)
        texts = [(label_text, [n for _, n in sig])]
        if bound is not None and len(bound.params) == len(sig):
            texts.append((reference_text, [n for _, n in bound.params]))
        tiles = tile_sizes(label_text, cand.kernel.name)
        made = probed_calls(sig, texts, reference, workdir / "probes", tiles)
        if not isinstance(made, str):
            return made, "probe", PROBE_ORIGIN
        probed = f"; {made}"
    if llm is None:
        why = f"no rule makes its inputs (not an element-wise rule wrapper){probed}"
        return [], "", why + " and no LLM is set"
    shown = None
    if not isinstance(found, str):
        lang = "python" if found.path.endswith(".py") else "cpp"
        shown = (found.kind, lang, (workdir / found.path).read_text("latin-1"))
    calls = write_llm_calls(
        cand,
        label_text,
        sig,
        shown,
        client=llm.client,
        store=llm.store,
        max_attempts=llm.max_attempts,
    )
    if isinstance(calls, str):
        return [], "", calls
    by = f"`make_calls`, written by {llm.client.model} and checked in the sandbox"
    return [BaseCall(args, f"make_calls by {llm.client.model}") for args in calls], "llm", by


def _python_reference(cand, refs, recorded, python_fn, function, label_text, workdir: Path):
    """The PyTorch function the repository's tests pair with the binding (python_reference.py),
    and the binding calls it covers."""
    full = exposed_signature(refs, function, label_text)
    if full is None or not all(n for _, n in full.params):
        return "no host signature to pair a PyTorch function with"
    hosts: dict[int, list | None] = {}  # each call carried down once (pairing, check, cases)

    def to_host(call):
        if id(call) not in hosts:
            try:
                hosts[id(call)] = carry_down(call, cand, refs)
            except Unmappable:
                hosts[id(call)] = None
        return hosts[id(call)]

    found = find_python_reference(
        cand,
        getattr(recorded, "refs", []),
        python_fn,
        list(full.params),
        full.returns,
        Path(refs.disc.root),
        workdir,
        to_host,
    )
    if isinstance(found, str):  # a backward op: autograd of the forward's PyTorch function
        if not is_backward(python_fn):
            return found
        args = (refs, python_fn, list(full.params), full.returns, workdir, to_host)
        grad = find_grad_reference(cand, recorded, *args)
        return f"{found}; {grad}" if isinstance(grad, str) else grad
    ref, pairing = found
    return ref, [c for c in recorded.get(python_fn, []) if pairing.covers(to_host(c) or [])]


def _within_reference(base: list, code: str) -> tuple[list, list[str]]:
    """The recorded calls a PyTorch reference runs on, and why the others are left out: a test
    also calls the op where it computes no expected value (mmcv's dynamic scatter with every
    point out of range: no voxel for the reference to stack), and the rows cut from such a call
    would take the place of the valid call's. All of them when the reference runs on none."""
    files = {"code.py": code, "calls.pt": [b.args for b in base]}
    found = run_checker(REFCHECK, files, "the reference", 2 * CHECK_TIMEOUT_S, ("raised.pt",))
    if isinstance(found, str):  # no answer: the cases show what is wrong
        return base, []
    raised = found["raised.pt"]
    kept = [b for k, b in enumerate(base) if k not in raised]
    why = [f"the reference raises on a recorded call: {raised[k][:120]}" for k in sorted(raised)]
    return (kept, why) if kept else (base, [])


def generate_for(
    cand: Candidate, refs, recorded: dict, workdir: Path, llm: ModelHelp | None = None
) -> None:
    """Set the candidate's reference, tests and testgen stage (never raises for bad input).
    `llm` (client, store, max_attempts) writes a reference where the repository has none."""
    start = time.perf_counter()
    cand.clear_stage(StageName.VERIFY)  # whatever comes out, the last verdict was on other tests
    behind = cand.wrapper.op_map.get("through_forward")  # the label runs it behind its forward
    function = (cand.wrapper.functions or [cand.wrapper.launcher])[0]
    label_text = (workdir / cand.wrapper.label_path).read_text("latin-1")
    behind_found = behind_forward(cand, refs, recorded, label_text, workdir) if behind else None
    if isinstance(behind_found, str) and behind.get("alone") and len(cand.wrapper.functions) > 1:
        # the backward takes its forward's results as optional: tested alone, as before the
        # glue, which stays in the label (the function every stage takes first is the backward's)
        log.info("%s: behind its forward: %s; tested alone", cand.id, behind_found)
        cand.wrapper.functions = [*cand.wrapper.functions[1:], cand.wrapper.functions[0]]
        cand.wrapper.op_map["not_through_forward"] = behind_found[:300]
        del cand.wrapper.op_map["through_forward"]
        behind, behind_found, function = None, None, cand.wrapper.functions[0]
    found = find_reference(cand, Path(refs.disc.root), workdir, refs) if not behind else ""
    python_fn = cand.wrapper.op_map.get("python_name") or ""
    # without a known binding, every recorded call is tried: the chain decides which fit
    names = public_names(cand) or list(recorded)
    calls = [c for n in names for c in recorded.get(n, [])]
    named = cand.kernel.name in label_text or bool(cand.kernel.from_macro)  # (a pasted name)
    if not named or "__global__" not in label_text:
        why = f"the label defines no __global__ {cand.kernel.name} (a revision without it?)"
        _skip(cand, Reason.UPSTREAM_FAILED, why, reference_kind="")
        return
    sig = exposed_params(refs, function, label_text)
    behind_base: list = []
    if behind:  # autograd through the forward's PyTorch function (testgen.behind_forward)
        found, behind_base = (behind_found, []) if isinstance(behind_found, str) else behind_found
    elif isinstance(found, str):  # the repository's PyTorch function its tests compare with
        mined = _python_reference(cand, refs, recorded, python_fn, function, label_text, workdir)
        if isinstance(mined, str) and sig:  # its Python's CPU driver of the op (driver_twin)
            driven = driver_reference(cand, refs, recorded, public_names(cand), sig, workdir)
            mined = f"{mined}; {driven}" if isinstance(driven, str) else driven
        if isinstance(mined, str):
            found = f"{found}; {mined}"
        else:
            found, calls = mined
    if isinstance(found, str) and llm is None:  # no reference to come: no cases needed
        cand.reference = Reference()
        found = _too_big(recorded, names, calls) + found
        _skip(cand, Reason.NO_REFERENCE, found, reference_kind="", llm_tried=False)
        return
    source, made_by, inputs_tried = "mined", "", False
    if not calls and is_backward(python_fn) and not behind:  # only through autograd
        derived_calls = backward_calls(python_fn, recorded, refs)
        if isinstance(derived_calls, list):
            calls, source = derived_calls, "forward"
    if not calls and python_fn:  # the tests took the Python's CPU branch (python_branch)
        calls = cuda_calls(refs, python_fn, recorded)[:MAX_TWIN_CALLS]
        source = "cpu_branch" if calls else source
    if not calls and python_fn:  # an op nobody calls, beside one that takes the same
        calls = sibling_calls(refs, python_fn, recorded)
        source = "sibling" if calls else source
    base, why = (behind_base, []) if behind else base_calls(cand, calls, refs)
    source = "forward" if behind else source
    if len(base) > 1 and not isinstance(found, str) and found.kind == "python":
        base, outside = _within_reference(base, (workdir / found.path).read_text("utf-8"))
        why += outside
    if not base and not behind:  # reached through a C++ autograd Function's backward
        base, source = _backward_on_chain(cand, recorded, refs, python_fn) or (base, source)
    if not base:  # (behind its forward: inputs for the glue, which the test calls)
        inputs_tried = llm is not None
        base, source, made_by = _made_calls(cand, label_text, sig, found, llm, workdir)
        if not base:
            never = _too_big(recorded, names, calls) or (
                f"the repository's tests never call {python_fn or 'its op'}"
            )
            why, made_by = [made_by, *(why or [never])], ""  # the last tried first: the
            # recorded calls' reasons would fill the 300 characters before it
    tried = llm is not None and isinstance(found, str) and bool(base)
    if tried:
        written = _llm_reference(cand, refs, base, label_text, sig, llm, workdir)
        found = written if not isinstance(written, str) else f"{found}; {written}"
    if isinstance(found, str):
        cand.reference = Reference()
        llm_tried = tried or inputs_tried  # asked once (inputs or reference): not again
        _skip(cand, Reason.NO_REFERENCE, found, reference_kind="", llm_tried=llm_tried)
        return
    cand.reference = found
    reference_text = (workdir / found.path).read_text("latin-1")
    if not base:
        _skip(
            cand,
            Reason.NO_CASES,
            "; ".join(dict.fromkeys(why)),  # one reason per kind, not one per recorded call
            reference_kind=found.kind,
            llm_inputs_tried=inputs_tried,
        )
        return
    params = [n for _, n in sig] if sig else refs.params_of(function)
    derived = binding_variants(base, cand, refs)
    args = [b.args for b in base]
    selectors = kernel_selectors(label_text, cand.kernel.name, params or [], args)
    sized = shape_selectors(label_text, cand.kernel.name, params or [], args)
    case_plan = plan(
        base,
        label_dtypes(label_text),
        params,
        derived,
        bool(made_by),
        selectors,
        sized,
        whole=source == "probe" or bool(behind),  # (a glue's gradients fit no cut rows)
        # (a probe's drafts are valid only as drafted; a glue's forward inputs take any rank)
        ranks=rank_choices(label_text, params or []) if source != "probe" else {},
    )
    order_free = order_free_reason(label_text)
    sorted_last = caller_sorts(Path(refs.disc.root), public_names(cand))
    kernel_params = [p.name for p in cand.kernel.params]
    others = unchecked(label_text, cand.kernel.name, kernel_params, function, params or [])
    text = render_test(
        cand, function, case_plan, reference_text, order_free, made_by, sorted_last, others
    )
    rel = f"tests/{cand.id}.py"
    (workdir / "tests").mkdir(exist_ok=True)
    (workdir / rel).write_text(text, encoding="utf-8")
    selected = [b for b in case_plan.base if b.selects]  # they reach the kernel's branches too
    dead = _dead_branches(cand, label_text, function, params, [*base, *selected])
    variants, kinds = _write_variants(cand, label_text, workdir, dead)
    recorded_dtypes = {
        str(a.dtype).removeprefix("torch.")
        for b in base
        for a in b.args
        if hasattr(a, "is_floating_point") and a.is_floating_point()
    }
    cand.tests = Tests(
        path=rel,
        hash=hashlib.sha256(text.encode()).hexdigest()[:20],
        cases_source=source,
        num_cases=len(case_plan.cases),
        num_shapes=case_plan.shapes,
        dtypes=sorted(recorded_dtypes | set(case_plan.dtypes)),
        variants=variants,
        variant_kinds=kinds,
    )
    short = []
    if cand.tests.num_cases < MIN_CASES or cand.tests.num_shapes < MIN_SHAPES:
        short.append(f"{cand.tests.num_cases} cases over {cand.tests.num_shapes} shapes")
    if len(set(kinds)) < 3:
        short.append(f"wrong variants of {len(set(kinds))} kinds")
    cand.set_stage(
        StageName.TESTGEN,
        StageResult(
            status=Status.OK,
            detail=("short: " + ", ".join(short)) if short else "",
            seconds=round(time.perf_counter() - start, 3),
            metrics={
                "num_cases": cand.tests.num_cases,
                "num_shapes": cand.tests.num_shapes,
                "reference_kind": found.kind,
                "cases_source": source,
                "variants": len(variants),
                "order_free": order_free,
                "sorted_last": sorted_last,
            },
        ),
    )
