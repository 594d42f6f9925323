"""The evaluation's progress line (log.EvalProgress): none for a short evaluation, then at most one every
`every` seconds with the iterations done, the rate and the time left; none after the last iteration (the
validation line follows)."""
from megatron.training.observability.log import EvalProgress


def test_a_long_evaluation_shows_progress_at_most_every_interval():
    times = iter([0.0, 10.0, 31.0, 40.0, 62.0, 100.0])
    progress = EvalProgress(100, every=30.0, clock=lambda: next(times))
    assert progress.after(1) is None  # 10 s in
    line = progress.after(3)  # 31 s in: 3 / 31 s, 97 left
    assert line == " evaluating: iteration        3/     100 | 0.10 iterations/s | ETA 0:16:42 |"
    assert progress.after(4) is None  # 9 s after the last line
    assert "iteration        6/     100" in progress.after(6)  # 62 s in
    assert progress.after(100) is None  # done: the validation line comes next
