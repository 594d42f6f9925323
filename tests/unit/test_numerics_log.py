"""What the log says about non-finite and skipped iterations (log.TrainingLogger), and the
--log-metrics-jsonl writer's records (metrics_log.MetricsLog), in one process."""
import json
import math
import re
from types import SimpleNamespace

import torch

from megatron.training.observability import log
from megatron.training.observability.metrics_jsonl import MetricsLog


def _losses(value):
    return {"lm loss": (torch.tensor(value), torch.tensor(1.0))}


def _line(monkeypatch, capsys, iterations):
    monkeypatch.setattr(log, "is_logging_rank", lambda: True)
    logger = log.TrainingLogger(10)
    for value, updated in iterations:
        logger.add_iteration(_losses(value), torch.tensor(1.5) if updated else None, updated)
    logger.log(len(iterations), 8, 1e-3, 8, flops_per_iter=1e9, world_size=1, loss_scale=2.0 ** 31)
    return capsys.readouterr().out


def test_fp16_skipped_iterations_log_their_loss_and_are_not_nan_iterations(monkeypatch, capsys):
    out = _line(monkeypatch, capsys, [(6.0, False), (4.0, False)])  # two overflowed steps, finite losses
    assert "lm loss: 5.000000E+00" in out
    assert "number of skipped iterations:   2" in out and "number of nan iterations:   0" in out


def test_nan_iterations_count_nan_losses_only(monkeypatch, capsys):
    out = _line(monkeypatch, capsys, [(float("nan"), True), (3.0, False), (5.0, True)])
    assert "lm loss: 4.000000E+00" in out  # the finite ones, skipped or not
    assert "number of skipped iterations:   1" in out and "number of nan iterations:   1" in out


def test_validation_ppl_of_a_nan_loss_is_nan(monkeypatch, capsys):
    monkeypatch.setattr(log, "is_logging_rank", lambda: True)
    logger = log.TrainingLogger(10)
    logger.log_validation(5, {"lm loss": float("nan")})
    logger.log_validation(6, {"lm loss": 30.0})  # a finite one keeps Megatron-LM's clamp at exp(20)
    out = capsys.readouterr().out
    assert re.search(r"iteration 5 \| lm loss value: NAN \| lm loss PPL: NAN \|", out), out
    assert f"lm loss PPL: {math.exp(20):.6E}" in out


def test_metrics_jsonl_records_full_precision(tmp_path):
    groups = SimpleNamespace(is_last_stage=True, tp_rank=0, dp_rank=0, cp_rank=0, world_size=1)
    path = tmp_path / "m.jsonl"
    m = MetricsLog(str(path), groups, resumed=False, device=torch.device("cpu"))
    loss = torch.tensor(1.0) / 3
    m.iteration(1, 8, {"lm loss": (loss * 7, torch.tensor(7.0))}, torch.tensor(0.1), 2e-3, True)
    m.iteration(2, 16, _losses(2.5), None, 2e-3, False, loss_scale=65536.0)
    m.validation(2, {"lm loss": 2.25})
    m.close()
    first, second, valid = [json.loads(x) for x in path.read_text().splitlines()]
    assert first["losses"]["lm loss"] == float(loss * 7 / 7) and first["grad_norm"] == float(torch.tensor(0.1))
    assert first["skipped"] is False and first["type"] == "train" and first["consumed_samples"] == 8
    assert second["grad_norm"] is None and second["skipped"] is True and second["loss_scale"] == 65536.0
    assert valid == {"type": "validation", "iteration": 2, "losses": {"lm loss": 2.25}}
    MetricsLog(str(path), groups, resumed=True, device=torch.device("cpu")).close()
    assert len(path.read_text().splitlines()) == 3  # a resumed run appends
