"""What the training step does for MoE layers, in one place: the router losses' gradient scale
before the schedule, their report as named loss terms after it, the expert-bias update after
the optimizer step, and the tokens-per-expert balance at log intervals. The loop holds the
RouterLosses the model's MoE layers record into (bind) and passes it to each hook. All are no-ops
for a model without MoE layers."""
from . import aux_losses
from .moe_layer import MoELayer


def moe_layers(model):
    """The MoELayer modules of `model` (a module or a list of pipeline chunks) on this rank."""
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def loss_names(config):
    """The router loss terms this config produces, in logging order."""
    names = [name for _, _, name in config.balance_losses()]
    if config.moe_z_loss_coeff:
        names.append("z_loss")
    return names


def _all_layers(config):
    """The decoder's layers and multi-token prediction's (numbered after them: they route too)."""
    return config.num_layers + (config.mtp_num_layers or 0)


def _config(model):
    layers = moe_layers(model)
    return layers[0].config if layers else None


def bind(model, losses=None):
    """Give the MoE layers of `model` one RouterLosses (`losses`, or a new one) to record into; -> it,
    or None for a model (or pipeline stage) without MoE layers."""
    layers = moe_layers(model)
    if not layers:
        return None
    losses = losses if losses is not None else aux_losses.RouterLosses()
    for layer in layers:
        layer.router.losses = losses
    return losses


def start_step(router_losses, num_microbatches, groups, loss_scale):
    """Before forward_backward: the router losses' backward scale (loss_scale / micro-batches in
    the global batch, as the token loss is normalised over the global batch; groups.dp_size: with
    context parallelism each CP rank's router loss is its part of the micro-batch's, so the parts'
    gradients, summed over DP x CP like every gradient, are the loss's). router_losses: bind()'s."""
    if router_losses is not None:
        router_losses.start_iteration(loss_scale, num_microbatches * groups.dp_size)


def finish_step(model, groups, num_microbatches, losses, updated, model_cfg=None, router_losses=None):
    """After the optimizer step: losses (ReducedLosses) with the router loss terms added
    (collective over groups.dp_cp and groups.pp, on every rank of a MoE model); moves the expert
    biases when the step was taken. model_cfg: the model's TransformerConfig; every pipeline stage
    must join the collectives, and a stage without MoE layers knows the model has them from it
    (None: read off this rank's MoE layers). router_losses: bind()'s (None on such a stage)."""
    config = model_cfg if model_cfg is not None else _config(model)
    if config is None or config.num_experts is None:
        return losses
    device = next(iter(losses.values()))[0].device
    moe_count = sum(config.is_moe_layer(n) for n in range(1, _all_layers(config) + 1))
    report = aux_losses.iteration_report(loss_names(config), groups, num_microbatches * groups.dp_size, moe_count,
                                         device, router_losses)
    if updated:
        for layer in moe_layers(model):
            layer.router.update_expert_bias(groups)
    return {**losses, **report}


def balance_line(config, groups, device, router_losses=None):
    """' tokens per expert min/max: a / b |' over the log interval (collective over groups.dp_cp and
    groups.pp), or '' without MoE. config: the model's TransformerConfig; router_losses: bind()'s."""
    if config.num_experts is None:
        return ""
    found = aux_losses.tokens_balance(groups, _all_layers(config), config.num_experts, device, router_losses)
    return f" tokens per expert min/max: {found[0]:.0f} / {found[1]:.0f} |" if found else ""
