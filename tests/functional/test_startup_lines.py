"""The start-up log through the real CLI under torchrun (issue 41, item 7): FP8 is named (formats, recipe,
layers, kernel) as the other precision and kernel choices are, and a modifier flag given without its feature
is on the accepted-no-effect line; each line printed once, not once per rank."""
from .cli import run_cli
from .test_bad_inputs import MOCK


def test_fp8_and_a_modifier_without_its_feature_are_named_once():
    proc = run_cli(MOCK + ["--num-layers", "3", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                           "--first-last-layers-bf16", "--num-layers-at-end-in-bf16", "0",
                           "--moe-router-topk", "1", "--wandb-exp-name", "run"], nproc=2)
    fp8 = [line for line in proc.stdout.splitlines() if line.startswith("> FP8: ")]
    assert len(fp8) == 1, proc.stdout[-3000:]
    assert fp8[0].startswith("> FP8: --fp8-format hybrid (e4m3fn forward, e5m2 gradients), tensorwise scaling")
    assert "layers 2-3 of 3 (--first-last-layers-bf16: 1 first, 0 last" in fp8[0] and "GEMMs: " in fp8[0]
    no_effect = [line for line in proc.stdout.splitlines() if line.startswith("> accepted, no effect here: ")]
    assert len(no_effect) == 1, proc.stdout[-3000:]
    assert "--moe-router-topk (it goes with --num-experts, not given)" in no_effect[0]
    assert "--wandb-exp-name (it goes with --wandb-project, not given)" in no_effect[0]
