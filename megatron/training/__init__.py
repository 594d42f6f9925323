"""The training side: CLI, initialisation, the pretrain loop, logging, tokenizers and data for now."""
