"""Pretrain a GPT model.

    python pretrain_gpt.py                      # embedded default: small GPT on stdlib source, CPU or GPU
    torchrun --nproc-per-node 4 pretrain_gpt.py --tensor-model-parallel-size 2 --mock-data \
        --tokenizer-type NullTokenizer --vocab-size 1024 ...
"""
import sys


from megatron.core.config import ConfigError
from megatron.core.models.gpt import GPTModel
from megatron.core.parallel_state import ParallelConfigError
from megatron.training.arguments import parse_args
from megatron.training.data import build_datasets
from megatron.training.initialize import initialize_distributed, shutdown, validate_config
from megatron.training.tokenizer import build_tokenizer
from megatron.training.training import pretrain


def model_provider(config, groups, device, pre_process=True, post_process=True, vp_stage=None):
    """One model chunk: this pipeline rank's layers of virtual stage vp_stage (all of them
    without pipelining); the embedding where pre_process, output layer and loss where post_process."""
    return GPTModel(config, groups, pre_process=pre_process, post_process=post_process, device=device,
                    vp_stage=vp_stage)


def forward_step(model, batch):
    """-> (per-token loss [b, s], loss mask [b, s]) on the last pipeline stage; earlier
    stages return their hidden states [s, b, h] in place of the loss."""
    return model(batch["tokens"], labels=batch["labels"]), batch["loss_mask"]


def main(argv=None):
    try:
        model_cfg, train_cfg = parse_args(argv)
        train_cfg.validate(1)  # tokenizer choice; re-checked with the real DP size below
        tokenizer = build_tokenizer(train_cfg)
        validate_config(model_cfg, train_cfg, tokenizer.vocab_size)
        groups, device = initialize_distributed(model_cfg, train_cfg)
        datasets = build_datasets(train_cfg, model_cfg, tokenizer)
    except (ConfigError, ParallelConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pretrain(model_cfg, train_cfg, groups, device, model_provider, forward_step, datasets,
             type(tokenizer).__name__)
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
