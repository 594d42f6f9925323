"""kill -9 at every moment of a checkpoint save, through the CLI: the same command then resumes
and continues bit-exactly (the printed losses and grad norms of every remaining iteration, and
the final weights and Adam moments bit for bit, equal an uninterrupted run's), and no committed
checkpoint is ever lost. Also: a full disk during a periodic save is one warning line, training goes
on and loses nothing.

Fault points: megatron/core/debug.py (MEGATRON_DEBUG_FAULT) and megatron/core/checkpointing/storage.py."""
import concurrent.futures
import os
import re
import resource
import shutil
import time

import pytest
import torch

from megatron.core.checkpointing import CheckpointReader, find_checkpoint

from .cli import run_cli

ARGS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--num-layers", "2",
        "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16", "--micro-batch-size", "2",
        "--train-iters", "6", "--save-interval", "2", "--eval-iters", "0", "--log-interval", "1",
        "--seed", "7"]  # dropout on: the RNG states must resume too
TRACKER = "latest_checkpointed_iteration.txt"
FINAL = ["iter_0000002", "iter_0000004", "iter_0000006", TRACKER]
# A save of a new iteration passes these; from rename.after on, the new checkpoint is what resumes.
NEW = ["ckpt.begin", "ckpt.rank_file.before", "ckpt.rank_file.write", "ckpt.rank_file.after",
       "ckpt.metadata.before", "ckpt.metadata.after", "ckpt.journal.after", "ckpt.rename.after",
       "ckpt.tracker.after", "ckpt.commit.done"]
# Saving an iteration the tracker names (its old copy is moved aside, then deleted).
RESAVE = ["ckpt.swap.aside", "ckpt.journal.after", "ckpt.rename.after", "ckpt.tracker.after", "ckpt.delete.during"]
LINE = re.compile(r"iteration\s+(\d+)/.*?\| lm loss: (\S+) \|.*?grad norm: (\S+) \|")


def figures(stdout):
    """{iteration: (loss, grad norm)} exactly as printed."""
    return {int(m.group(1)): m.group(2, 3) for m in LINE.finditer(stdout)}


def state(path):
    """{(key, state): tensor} of a checkpoint directory (weights and Adam moments)."""
    reader = CheckpointReader(path)
    return {(p["key"], p["state"]): p["data"] for r in reader.rank_payloads.values() for p in r["pieces"]}


def same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def kill_then_resume(args, point, iteration, d, rank="", nproc=1):
    """Run `args` until the fault point kills it, then the same command: -> (the kill run's
    exit code, the checkpoint found right after the kill, the resumed run)."""
    env = {"MEGATRON_DEBUG_FAULT": f"{point}:{iteration}:{rank}"}
    killed = run_cli(args, nproc=nproc, check=False, env=env)
    after_kill = find_checkpoint(d, allow_empty=True)
    return killed, after_kill and state(after_kill), run_cli(args, nproc=nproc, check=False)


def check_resume(ref, resumed, d, first):
    """The resumed run's problems (empty when it continued bit-exactly from iteration `first`)."""
    if resumed.returncode != 0:
        return [f"resume exited {resumed.returncode}: {resumed.stderr[-1500:]}"]
    got, problems = figures(resumed.stdout), []
    if sorted(got) != list(range(first, 7)):
        problems.append(f"resumed iterations {sorted(got)}, expected {first}..6")
    if any(got[i] != ref["figures"][i] for i in got):
        problems.append("losses or grad norms differ from the uninterrupted run")
    if not same_state(state(os.path.join(d, "iter_0000006")), ref["final"]):
        problems.append("final weights or Adam moments differ")
    if sorted(os.listdir(d)) != FINAL:
        problems.append(f"leftovers: {sorted(os.listdir(d))}")
    return problems


def fresh_case(ref, root, point, iteration):
    """Kill the first run into an empty --save/--load directory."""
    d = os.path.join(root, f"fresh-{point}-{iteration}")
    killed, _, resumed = kill_then_resume(ARGS + ["--save", d, "--load", d], point, iteration, d)
    in_place = NEW.index(point) >= NEW.index("ckpt.rename.after")
    return killed.returncode, check_resume(ref, resumed, d, iteration + 1 if in_place else iteration - 1)


def resave_case(ref, root, point):
    """--load SRC (at iteration 2) --save D, where D's tracker already names iteration 4:
    the run saves 4 again over it. Right after the kill, D still holds iteration 4."""
    d = os.path.join(root, f"resave-{point}")
    shutil.copytree(ref["dir"], d, ignore=shutil.ignore_patterns("iter_0000006"))
    with open(os.path.join(d, TRACKER), "w") as f:
        f.write("4")
    killed, after_kill, resumed = kill_then_resume(ARGS + ["--load", ref["src"], "--save", d], point, 4, d)
    problems = [] if after_kill is not None and same_state(after_kill, ref["at4"]) else ["iteration 4 was lost"]
    return killed.returncode, problems + check_resume(ref, resumed, d, 3)


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run (saves 2, 4, 6), and a copy of it holding only iteration 2."""
    root = str(tmp_path_factory.mktemp("crash"))
    d, src = os.path.join(root, "reference"), os.path.join(root, "src")
    out = run_cli(ARGS + ["--save", d]).stdout
    shutil.copytree(d, src, ignore=shutil.ignore_patterns("iter_0000004", "iter_0000006"))
    with open(os.path.join(src, TRACKER), "w") as f:
        f.write("2")
    return {"root": root, "dir": d, "src": src, "figures": figures(out),
            "final": state(os.path.join(d, "iter_0000006")), "at4": state(os.path.join(d, "iter_0000004"))}


@pytest.mark.slow
def test_kill_at_every_moment_of_a_save_then_resume_bit_exactly(reference):
    start, cpu = time.perf_counter(), _children_cpu()
    root = reference["root"]
    cases = {**{f"{p} @{it}": (fresh_case, reference, root, p, it) for it in (2, 4) for p in NEW},
             **{f"re-save {p} @4": (resave_case, reference, root, p) for p in RESAVE}}
    workers = max(1, min(4, os.cpu_count() or 1))  # two cores: two runs at a time
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = {name: pool.submit(*case) for name, case in cases.items()}
    results = {name: r.result() for name, r in results.items()}
    killed = [n for n, (code, _) in results.items() if code == -9]
    exact = [n for n, (_, problems) in results.items() if not problems]
    print(f"\n{len(killed)}/{len(cases)} moments killed (SIGKILL), {len(exact)}/{len(cases)} resumed bit-exactly "
          f"({time.perf_counter() - start:.0f} s, runs' CPU time {_children_cpu() - cpu:.0f} s)")
    assert len(cases) >= 20 and len(killed) == len(cases), sorted(set(cases) - set(killed))
    assert len(exact) == len(cases), {n: p for n, (_, p) in results.items() if p}


@pytest.mark.slow
def test_full_disk_during_a_save_is_one_line_and_loses_nothing(reference):
    """A periodic save that fails is one warning line; training goes on unchanged and the next save works
    (issue 41: test_save_failures.py has the other save modes and the limit)."""
    d = os.path.join(reference["root"], "full-disk")
    args = ARGS + ["--save", d, "--load", d]
    proc = run_cli(args, check=False, env={"MEGATRON_DEBUG_FAULT": "ckpt.rank_file.write:4::enospc"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith("> warning:")]
    assert len(lines) == 1 and "cannot save iteration 4: No space left on device" in lines[0], lines
    assert "iteration 2 is still the latest" in lines[0]
    assert sorted(os.listdir(d)) == ["iter_0000002", "iter_0000006", TRACKER]  # the partial iter_0000004.tmp is gone
    assert figures(proc.stdout) == reference["figures"]
    assert same_state(state(os.path.join(d, "iter_0000006")), reference["final"])


@pytest.mark.slow
def test_two_ranks_one_killed_after_its_file(tmp_path):
    """Rank-specific: TP 2, rank 1 killed right after writing its file of iteration 4 (rank 0
    waits at the barrier until torchrun stops it); the same command resumes from iteration 2."""
    args = ARGS + ["--tensor-model-parallel-size", "2"]
    ref_dir, d = str(tmp_path / "reference"), str(tmp_path / "ck")
    out = run_cli(args + ["--save", ref_dir], nproc=2).stdout
    ref = {"figures": figures(out), "final": state(os.path.join(ref_dir, "iter_0000006"))}
    killed, after_kill, resumed = kill_then_resume(args + ["--save", d, "--load", d], "ckpt.rank_file.after", 4, d,
                                                   rank=1, nproc=2)
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-3000:]
    assert after_kill is not None  # iteration 2
    assert check_resume(ref, resumed, d, 3) == []
