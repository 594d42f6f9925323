"""Megatron-LM's own example recipes, as data: the flags each script passes to pretrain_gpt.py and the
world size it runs at (issue 31). Transcribed by hand from NVIDIA/Megatron-LM main (snapshot
d98e8a64, 2026-08-22); each entry names its script. Only the flag lists are kept, in the order and
form bash hands them to the program: an array expanded unquoted splits on whitespace and keeps
quotes that were inside a quoted element (so "--split '99,1,0'" arrives as `'99,1,0'`). Placeholders
($DATA_PATH, $CHECKPOINT_PATH, ...) are replaced by plain relative paths; the default branch of each
script's if/else is taken (mock data unless said otherwise, Megatron-FSDP on, profiling off).

The world size is GPUS_PER_NODE x NUM_NODES as the script sets it, or, where the script's parallel
sizes need more ranks than that, the smallest world those sizes imply (said per recipe).
"""
from typing import NamedTuple


class Recipe(NamedTuple):
    name: str
    source: str  # the script in Megatron-LM
    world_size: int
    argv: tuple
    vocab_size: int  # what the recipe's tokenizer files hold (a NullTokenizer the test builds for real)


def _args(text):
    return tuple(text.split())


_LLAMA3_8B_MODEL = _args("""
    --use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192
    --max-position-embeddings 8192 --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0
    --attention-dropout 0.0 --hidden-dropout 0.0 --swiglu --normalization RMSNorm --init-method-std 0.0134
    --attention-backend fused --apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear
""")
_LLAMA3_8B_SCHEDULE = _args("""
    --micro-batch-size 1 --global-batch-size 128 --train-samples 1953125000 --lr-decay-samples 1949218748
    --lr-warmup-samples 3906252 --lr 0.00015 --min-lr 0.00001 --decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5
    --lr-decay-style cosine --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --bf16
""")
_FP8 = _args("--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --fp8-param-gather")
_MOCK_DATA = _args("""
    --mock-data --tokenizer-type NullTokenizer --vocab-size 128256 --data-cache-path cache --tiktoken-pattern v2
    --split '99,1,0' --no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers 1
""")
_REAL_DATA = _args("""
    --data-path corpus_text_document --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer
    --data-cache-path cache --split '99,1,0' --no-create-attention-mask-in-dataloader --no-mmap-bin-files
    --num-workers 1 --vocab-size 128256
""")


def _llama3_8b(data):  # examples/llama/train_llama3_8b_h100_fp8.sh
    return (_LLAMA3_8B_MODEL + _LLAMA3_8B_SCHEDULE + _args("""
        --grad-reduce-in-bf16 --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc
        --empty-unused-memory-level 1 --exit-duration-in-mins 235
        --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather""") + _FP8
        + _args("--tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel") + data
        + _args("""--log-interval 1 --eval-iters 32 --eval-interval 100 --save-interval 1000 --log-throughput
        --profile --profile-step-start 4 --profile-step-end 6 --ckpt-format torch_dist
        --distributed-timeout-minutes 60 --save ckpt --load ckpt --tensorboard-dir tb"""))


def _fsdp_llama3_8b(data):  # examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh, USE_MEGATRON_FSDP=1
    return (_LLAMA3_8B_MODEL + _LLAMA3_8B_SCHEDULE + _args("""
        --cross-entropy-loss-fusion --no-check-for-nan-in-loss-and-grad --manual-gc --empty-unused-memory-level 1
        --exit-duration-in-mins 235 --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params
        --no-gradient-accumulation-fusion --calculate-per-token-loss --init-model-with-meta-device
        --ckpt-format fsdp_dtensor --use-nccl-ub --fsdp-double-buffer --fsdp-manual-registration
        --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather""") + _FP8
        + _args("--tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel") + data
        + _args("""--log-interval 1 --eval-iters 32 --eval-interval 100 --save-interval 1000 --log-throughput
        --logging-level 20 --distributed-timeout-minutes 60 --save ckpt --load ckpt --tensorboard-dir tb"""))


_GPT3_175B = _args("""
    --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048
    --attention-backend auto --micro-batch-size 1 --global-batch-size 1536
""") + ("--step-batch-size-schedule", "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536") + _args("""
    --train-iters 500000 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006
    --clip-grad 1.0 --fp16 --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001
    --lr-decay-iters 430000 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16
    --data-path corpus_text_document --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --split 949,50,1
    --log-interval 100 --save-interval 10000 --eval-interval 1000 --save ckpt --load ckpt --eval-iters 10
    --tensorboard-dir tb
""")

_MIXTRAL_8X7B = _args("""
    --use-mcore-models --disable-bias-linear --seq-length 4096 --max-position-embeddings 32768 --num-layers 32
    --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01
    --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope --swiglu
    --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8 --no-masked-softmax-fusion
    --no-position-embedding --rotary-base 1000000
    --num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce
    --tokenizer-type Llama2Tokenizer --tokenizer-model tokenizer.model --data-path corpus_text_document
    --split 99990,8,2
    --micro-batch-size 1 --global-batch-size 256 --lr 1e-4 --train-iters 500000 --lr-decay-iters 320000
    --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1 --lr-warmup-iters 500 --clip-grad 1.0 --bf16
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --expert-model-parallel-size 8
    --use-distributed-optimizer --sequence-parallel
    --log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 10 --save ckpt --load ckpt
    --tensorboard-dir ckpt/tensorboard --no-load-optim --no-load-rng
""")

_DEEPSEEK_V3 = _args("""
    --distributed-timeout-minutes 60 --tensor-model-parallel-size 1 --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1 --context-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce
    --overlap-param-gather --use-mcore-models --sequence-parallel --use-flash-attn --disable-bias-linear
    --micro-batch-size 4 --global-batch-size 2048 --train-samples 585937500 --exit-duration-in-mins 220
    --no-check-for-nan-in-loss-and-grad --manual-gc --manual-gc-interval 10 --recompute-granularity selective
    --recompute-modules mlp moe mla_up_proj layernorm --transformer-impl transformer_engine --seq-length 4096
    --data-cache-path out/cache --tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-V3
    --data-path corpus_text_document --split 99,1,0 --no-mmap-bin-files --no-create-attention-mask-in-dataloader
    --num-workers 6 --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128
    --kv-channels 128 --max-position-embeddings 4096 --position-embedding-type rope --rotary-base 10000
    --make-vocab-size-divisible-by 3232 --normalization RMSNorm --norm-epsilon 1e-6 --swiglu
    --untie-embeddings-and-output-weights --multi-latent-attention --attention-dropout 0.0 --hidden-dropout 0.0
    --clip-grad 1.0 --weight-decay 0.1 --qk-layernorm --lr-decay-samples 584765624 --lr-warmup-samples 1536000
    --lr-warmup-init 3.9e-7 --lr 3.9e-6 --min-lr 3.9e-7 --lr-decay-style cosine --adam-beta1 0.9 --adam-beta2 0.95
    --num-experts 256 --moe-layer-freq [0]*3+[1]*58 --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size 2048 --moe-router-load-balancing-type seq_aux_loss --moe-router-topk 8
    --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-router-pre-softmax
    --moe-grouped-gemm --moe-aux-loss-coeff 1e-4 --moe-router-group-topk 4 --moe-router-num-groups 8
    --moe-router-topk-scaling-factor 2.5 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
    --moe-router-bias-update-rate 1e-3 --moe-router-dtype fp32 --moe-permute-fusion --moe-router-force-load-balancing
    --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128
    --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0 --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1
    --eval-iters 32 --eval-interval 100 --auto-detect-ckpt-format --load out/checkpoints --save out/checkpoints
    --save-interval 100 --dist-ckpt-strictness log_all --init-method-std 0.02 --log-timers-to-tensorboard
    --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm --log-validation-ppl-to-tensorboard
    --log-throughput --log-interval 1 --logging-level 40 --tensorboard-dir out/tensorboard --bf16
    --enable-experimental
    --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion
    --use-distributed-optimizer --calculate-per-token-loss --init-model-with-meta-device --ckpt-format fsdp_dtensor
    --fsdp-double-buffer --use-nccl-ub --megatron-fsdp-grad-comm-dtype bf16 --megatron-fsdp-main-grads-dtype bf16
    --wandb-project your_own_wandb_project --wandb-exp-name DeepSeek-V3-TP1EP8-MBS4GBS2048-
""")

_GPTOSS_HEAD = _args("""
    --no-masked-softmax-fusion --transformer-impl transformer_engine --disable-bias-linear
    --untie-embeddings-and-output-weights --no-rope-fusion --normalization RMSNorm --num-layers 12 --hidden-size 512
    --ffn-hidden-size 2048 --num-attention-heads 64 --group-query-attention --num-query-groups 8 --seq-length 8192
    --max-position-embeddings 8192 --use-mcore-models --rotary-percent 1.0 --rope-type rope
    --position-embedding-type rope --rotary-base 10000 --no-bias-gelu-fusion --export-force-local-attention
    --no-bias-dropout-fusion --quick-geglu --glu-linear-offset 1.0 --softmax-type learnable --window-attn-skip-freq 2
    --activation-func-clamp-value 7.0 --window-size 127,0 --enable-gpt-oss
    --num-experts 4 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce
    --moe-ffn-hidden-size 2048 --moe-router-dtype fp32 --moe-z-loss-coeff 1e-3 --moe-permute-fusion
""")
_GPTOSS_TAIL = _args("""
    --micro-batch-size 1 --global-batch-size 128 --lr 1.0e-5 --train-samples 1953125000
    --lr-decay-samples 1949218748 --lr-decay-style cosine --min-lr 1.0e-6 --weight-decay 0.1
    --lr-warmup-fraction 0.05 --clip-grad 1.0 --bf16 --use-flash-attn --attention-softmax-in-fp32
    --accumulate-allreduce-grads-in-fp32 --disable-bf16-reduced-precision-matmul --recompute-activations
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --expert-model-parallel-size 1
    --sequence-parallel --context-parallel-size 1 --use-distributed-optimizer --fp8-format hybrid
    --fp8-param-gather --fp8-amax-compute-algo max --fp8-amax-history-len 1024
    --log-interval 1 --save-interval 10000 --eval-interval 50000000 --eval-iters 0 --save ckpt
    --tensorboard-dir ckpt/tensorboard --moe-per-layer-logging --no-load-optim --no-load-rng --log-throughput
""")

RECIPES = (
    # 8 GPUs x 1 node in the script, but TP 8 x PP 16 needs 128 ranks: 16 nodes
    Recipe("gpt3-175b", "examples/gpt3/train_gpt3_175b_distributed.sh", 128, _GPT3_175B, 50257),
    Recipe("llama3-8b-fp8 (mock data)", "examples/llama/train_llama3_8b_h100_fp8.sh", 8, _llama3_8b(_MOCK_DATA),
           128257),
    Recipe("llama3-8b-fp8 (real data)", "examples/llama/train_llama3_8b_h100_fp8.sh", 8, _llama3_8b(_REAL_DATA),
           128256),
    # 8 GPUs x SLURM_NNODES; PP 4 x EP 8 (EP carved out of DP) needs 32 ranks: 4 nodes
    Recipe("mixtral-8x7b", "examples/mixtral/train_mixtral_8x7b_distributed.sh", 32, _MIXTRAL_8X7B, 32000),
    Recipe("megatron-fsdp llama3-8b-fp8 (mock data)", "examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh", 8,
           _fsdp_llama3_8b(_MOCK_DATA), 128257),
    Recipe("megatron-fsdp llama3-8b-fp8 (real data)", "examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh", 8,
           _fsdp_llama3_8b(_REAL_DATA), 128256),
    # the node count is the user's (#SBATCH --nodes); EP 8 and MBS 4 x DP dividing GBS 2048: 8 nodes x 8 GPUs
    Recipe("deepseek-v3 (megatron-fsdp)", "examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh", 64, _DEEPSEEK_V3,
           129280),
    # PP = WORLD_SIZE; at the default 8 GPUs its 12 layers do not split over 8 stages (Megatron-LM refuses
    # that too; its README says to adjust the sizes): GPUS_PER_NODE=4, so PP 4
    Recipe("gpt-oss (mock data)", "examples/gptoss/02_train.sh", 4, _GPTOSS_HEAD + _MOCK_DATA + _GPTOSS_TAIL, 128257),
)
