"""Mixture of Experts (Megatron-Core's flags): router, dispatchers, experts, the MoE layer."""
