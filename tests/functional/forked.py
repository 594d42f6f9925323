"""Run many short command lines of the repository's scripts from one Python start: import torch and
megatron once, then fork a child per command line that runs the script as `python script args` would
(sys.argv, __main__, its exit code, its stdout and stderr). A bad-input case that fails in argument
checks then costs milliseconds instead of the 2-3 s of a fresh interpreter importing torch.

    python -m tests.functional.forked < cases.json > results.json

cases.json: [[script, [arguments]], ...]; results.json: [{"returncode", "stdout", "stderr"}, ...].
The parent imports only (no torch op runs before a fork, so no thread pool is copied half-held);
each child is a separate process, so nothing one case sets reaches the next.
"""
import json
import os
import runpy
import sys
import tempfile
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRELOAD = ("torch", "numpy", "megatron.training.loop.launch", "megatron.training.config.arguments",
           "megatron.training.data.loader",
           "megatron.training.data.embedded", "megatron.core.models.gpt", "megatron.core.models.bert",
           "megatron.training.loop.training", "megatron.training.planner")


def _child(script, args, out, err):
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.argv = [script] + list(args)
    try:
        runpy.run_path(os.path.join(REPO, script), run_name="__main__")
        code = 0
    except SystemExit as e:  # sys.exit(main()) of the tools, argparse's exit 2
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # as the interpreter would: the traceback on stderr, exit code 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(script, args):
    """-> {"returncode", "stdout", "stderr"} of `python script args` run in a forked child."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(script, args, out.fileno(), err.fileno())
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
    return {"returncode": code, "stdout": texts[0], "stderr": texts[1]}


def main():
    os.chdir(REPO)
    sys.path.insert(0, REPO)
    for name in PRELOAD:
        __import__(name)
    cases = json.load(sys.stdin)
    if any(script.endswith("convert.py") for script, _ in cases):
        __import__("transformers")  # seconds to import: once, not per conversion case
    json.dump([run(script, args) for script, args in cases], sys.stdout)


if __name__ == "__main__":
    main()
