"""HuggingFace DeepSeek-V3 <-> ours: the same logits as transformers' DeepseekV3ForCausalLM (fp32, random tiny
configs: with and without query compression, YaRN and plain RoPE, group-limited routing with an expert bias,
dense first layers, shared experts), a round trip through tools/checkpoint/convert.py that gives back every
tensor bit for bit, multi-token prediction modules read from and written to the files as DeepSeek-V3's hold
them (their losses equal a reference built from transformers' layers), and one-line refusals for what one side
cannot hold."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from megatron.core.checkpointing.pieces import CheckpointError  # noqa: E402
from megatron.core.config import TransformerConfig  # noqa: E402
from megatron.core.models.families.deepseek_v3 import to_hf as ours_to_deepseek_v3  # noqa: E402
from megatron.core.models.families.deepseek_v3 import to_ours as deepseek_v3_to_ours  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.parallel_layout import ParallelLayout  # noqa: E402
from megatron.core.tensor_parallel.param_meta import param_meta  # noqa: E402
from tests.hf_round_trip import round_trip  # noqa: E402

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}


def tiny(q_lora_rank=12, rope=YARN, seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(vocab_size=100, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
                routed_scaling_factor=2.5, kv_lora_rank=10, q_lora_rank=q_lora_rank, qk_rope_head_dim=4,
                v_head_dim=6, qk_nope_head_dim=8, n_group=4, topk_group=2, num_experts_per_tok=4,
                first_k_dense_replace=1, max_position_embeddings=32, rope_parameters=dict(rope),
                tie_word_embeddings=False)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**{**args, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.05)  # the expert bias moves the choice
    return model


def ours_from(hf, sd=None):
    args, tensors = deepseek_v3_to_ours(hf.config, dict(hf.state_dict()) if sd is None else sd)
    config = TransformerConfig(**args, make_vocab_size_divisible_by=1).resolve()
    config.validate()
    model = GPTModel(config, ParallelLayout(1).plan_groups(0), device="cpu").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(tensors[param_meta(p).init_key])
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(tensors[name])
    return model


@pytest.mark.parametrize("kw", [{}, {"q_lora_rank": None}, {"rope": {"rope_type": "default", "rope_theta": 5000.0}},
                                {"n_group": 1, "topk_group": 1, "tie_word_embeddings": True}],
                         ids=["q-lora-yarn", "q-direct", "plain-rope", "no-groups-tied"])
def test_logits_equal_transformers(kw):
    hf = tiny(**kw)
    ours = ours_from(hf)
    ids = torch.tensor([[5, 17, 56, 3, 99, 42, 7, 8, 11, 64, 2, 33], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    with torch.no_grad():
        got, want = ours(ids)[..., :100], hf(ids).logits
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel <= 1e-5, rel


def test_convert_round_trip_is_bit_exact_with_the_expert_bias(tmp_path):
    back, want = round_trip(tmp_path, tiny(), transformers.DeepseekV3ForCausalLM)
    assert back.keys() == want.keys()
    assert all(torch.equal(back[k], want[k]) for k in want), [k for k in want if not torch.equal(back[k], want[k])]
    assert back["model.layers.1.mlp.gate.e_score_correction_bias"].abs().min() > 0


@pytest.mark.parametrize("kw,match", [
    ({"n_group": 2, "topk_group": 1}, "top-2 scores"),
    ({"norm_topk_prob": False}, "norm_topk_prob"),
    ({"rms_norm_eps": 1e-5}, "latent norms"),
    ({"rope_interleave": False}, "rope_interleave")])
def test_what_ours_cannot_hold_is_refused_in_one_line(kw, match):
    hf = tiny(**kw)
    with pytest.raises(CheckpointError, match=match) as e:
        deepseek_v3_to_ours(hf.config, dict(hf.state_dict()))
    assert "\n" not in str(e.value)


def test_what_hf_cannot_hold_is_refused_in_one_line():
    hf = tiny()
    args, tensors = deepseek_v3_to_ours(hf.config, dict(hf.state_dict()))
    bias = {k: tensors.pop(k) for k in [k for k in tensors if k.endswith("expert_bias")]}
    for change, match in ((dict(moe_layer_freq=[1, 0, 1]), "dense layers first"),
                          (dict(moe_router_group_topk=1), "top-2 scores")):
        with pytest.raises(CheckpointError, match=match) as e:
            ours_to_deepseek_v3(dict(args, **change), tensors, dict(bias))
        assert "\n" not in str(e.value)


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _mtp_checkpoint(tmp_path, depth=1):
    """A DeepSeek-V3 directory as DeepSeek's own files are: 3 decoder layers, then `depth` MTP modules stored as
    model.layers.3.. (a decoder layer each, with enorm / hnorm / eh_proj / shared_head and copies of the
    embedding and head), num_nextn_predict_layers = depth. -> (directory, config-only model, its tensors, the
    (3 + depth)-layer model whose last layers are the MTP modules' transformer layers)."""
    from safetensors.torch import save_file
    full = tiny(num_hidden_layers=3 + depth)
    sd = {k: v.clone() for k, v in full.state_dict().items()}
    g, h = torch.Generator().manual_seed(3), full.config.hidden_size
    for k in range(depth):
        s = f"model.layers.{3 + k}."
        for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
            sd[s + name] = 1 + 0.1 * torch.randn(h, generator=g)
        sd[s + "eh_proj.weight"] = 0.1 * torch.randn(h, 2 * h, generator=g)
        sd[s + "embed_tokens.weight"] = sd["model.embed_tokens.weight"].clone()
        sd[s + "shared_head.head.weight"] = sd["lm_head.weight"].clone()
        gate_up, down = sd.pop(s + "mlp.experts.gate_up_proj"), sd.pop(s + "mlp.experts.down_proj")
        for e in range(gate_up.shape[0]):  # one by one, as DeepSeek-V3's files (and transformers 5's) name experts
            sd[f"{s}mlp.experts.{e}.gate_proj.weight"], sd[f"{s}mlp.experts.{e}.up_proj.weight"] = \
                (w.clone() for w in gate_up[e].chunk(2))
            sd[f"{s}mlp.experts.{e}.down_proj.weight"] = down[e].clone()
    small = tiny(num_hidden_layers=3, num_nextn_predict_layers=depth)
    small.config.save_pretrained(tmp_path / "hf")
    save_file(sd, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    return tmp_path / "hf", small, sd, full


def test_mtp_modules_read_from_the_files_predict_as_deepseek_defines(tmp_path):
    _, small, sd, full = _mtp_checkpoint(tmp_path)
    ours = ours_from(small, dict(sd))
    assert ours.config.mtp_num_layers == 1
    g = torch.Generator().manual_seed(5)
    ids, labels = torch.randint(0, 100, (2, 12), generator=g), torch.randint(0, 100, (2, 12), generator=g)
    ahead = torch.cat([ids[:, 1:], torch.zeros(2, 1, dtype=ids.dtype)], 1)
    ahead_labels = torch.cat([labels[:, 1:], torch.zeros(2, 1, dtype=ids.dtype)], 1)
    with torch.no_grad():
        _, (got,) = ours(ids, labels=labels, mtp_inputs=[(ahead, ahead_labels)])
        # the reference: h1 = shared_head.norm(layer_3(eh_proj([enorm(embed(next tokens)); hnorm(h0)]))), with
        # h0 the decoder's normed output and transformers' own decoder layers, rotary table and causal mask
        from transformers.masking_utils import create_causal_mask
        m, eps, s = full.model, full.config.rms_norm_eps, "model.layers.3."
        pos = torch.arange(12)[None]
        x = m.embed_tokens(ids)
        mask = create_causal_mask(config=full.config, inputs_embeds=x, attention_mask=None, cache=None,
                                  position_ids=pos)
        rope = m.rotary_emb(x, pos)
        for layer in m.layers[:3]:
            x = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rope)
        h0 = m.norm(x)
        u = torch.cat([_rms(m.embed_tokens(ahead), sd[s + "enorm.weight"], eps), _rms(h0, sd[s + "hnorm.weight"], eps)],
                      -1) @ sd[s + "eh_proj.weight"].t()
        h1 = _rms(m.layers[3](u, attention_mask=mask, position_ids=pos, position_embeddings=rope),
                  sd[s + "shared_head.norm.weight"], eps)
        want = torch.nn.functional.cross_entropy(full.lm_head(h1).flatten(0, 1), ahead_labels.flatten(),
                                                 reduction="none").view(2, 12)
    rel = ((got - want)[:, :-1].abs().max() / want.abs().max()).item()  # the last position has no token ahead
    assert rel <= 1e-5, rel


def test_mtp_files_round_trip_bit_exact(tmp_path):
    from megatron.core.checkpointing.hf_files import read_state_dict
    from tests.hf_round_trip import convert_module
    path, small, sd, _ = _mtp_checkpoint(tmp_path, depth=2)
    convert = convert_module()
    assert convert.main(["--loader", "hf", "--saver", "megatron", "--load-dir", str(path),
                         "--save-dir", str(tmp_path / "ours")]) == 0
    assert convert.main(["--loader", "megatron", "--saver", "hf", "--load-dir", str(tmp_path / "ours"),
                         "--save-dir", str(tmp_path / "back")]) == 0
    back = read_state_dict(tmp_path / "back")
    mtp = [k for k in sd if k.startswith(("model.layers.3.", "model.layers.4."))]
    assert mtp and [k for k in mtp if k not in back or not torch.equal(back[k], sd[k])] == []  # as the files name them
    # the decoder's experts: transformers writes them one by one, the source held them fused; the same tensors
    _, want = deepseek_v3_to_ours(small.config, dict(sd))
    _, got = deepseek_v3_to_ours(small.config, back)
    assert got.keys() == want.keys() and [k for k in want if not torch.equal(got[k], want[k])] == []
    hf = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp_path / "back")  # transformers skips the MTP layers
    assert hf.config.num_nextn_predict_layers == 2 and len(hf.model.layers) == 3


def test_mtp_files_ours_cannot_hold_are_refused_in_one_line(tmp_path):
    _, small, sd, _ = _mtp_checkpoint(tmp_path, depth=1)
    for change, match in (({"model.layers.3.shared_head.head.weight": sd["lm_head.weight"] + 1}, "shares"),):
        with pytest.raises(CheckpointError, match=match) as e:
            deepseek_v3_to_ours(small.config, {**sd, **change})
        assert "\n" not in str(e.value)
    small.config.num_nextn_predict_layers = 2  # the files hold one of two
    with pytest.raises(CheckpointError, match="hold 1") as e:
        deepseek_v3_to_ours(small.config, dict(sd))


def test_mtp_layers_config_json_promises_but_the_files_lack_are_named(tmp_path, capsys):
    """transformers' save_pretrained keeps num_nextn_predict_layers but writes no MTP layer: one line says the
    conversion goes without them (issue 41)."""
    from tests.hf_round_trip import convert_module
    tiny(num_hidden_layers=3, num_nextn_predict_layers=1).save_pretrained(tmp_path / "hf")
    assert convert_module().main(["--loader", "hf", "--saver", "megatron", "--load-dir", str(tmp_path / "hf"),
                                  "--save-dir", str(tmp_path / "ours")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "multi-token prediction" in line]
    assert notes == [f"> {tmp_path / 'hf'}/config.json names 1 multi-token prediction layer(s) "
                     "(num_nextn_predict_layers) that its files do not hold (transformers writes none): converted "
                     "without them (no --mtp-num-layers); convert DeepSeek's own files to keep them"]
    _mtp_checkpoint(tmp_path / "full", depth=1)  # the files hold it: no line
    assert convert_module().main(["--loader", "hf", "--saver", "megatron", "--load-dir", str(tmp_path / "full" / "hf"),
                                  "--save-dir", str(tmp_path / "ours2")]) == 0
    assert "multi-token prediction" not in capsys.readouterr().out


def test_extra_tensors_join_a_sharded_save(tmp_path):
    """What transformers' model has no place for (the MTP layers) joins the files save_pretrained wrote: into
    model.safetensors, or, for a sharded save, as one more shard the index names; read back whole."""
    import json

    from safetensors.torch import save_file

    from megatron.core.checkpointing.hf_files import add_to_saved_files, read_state_dict
    g = torch.Generator().manual_seed(9)
    first, second = {"a": torch.randn(3, generator=g)}, {"b": torch.randn(2, generator=g)}
    save_file(first, tmp_path / "model-00001-of-00002.safetensors")
    save_file(second, tmp_path / "model-00002-of-00002.safetensors")
    index = {"metadata": {"total_size": 20}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                            "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    extra = {"model.layers.3.eh_proj.weight": torch.randn(2, 4, generator=g)}
    add_to_saved_files(tmp_path, extra)
    back = read_state_dict(tmp_path)
    assert sorted(back) == ["a", "b", "model.layers.3.eh_proj.weight"]
    assert all(torch.equal(back[k], v) for k, v in {**first, **second, **extra}.items())
    assert json.loads((tmp_path / "model.safetensors.index.json").read_text())["metadata"]["total_size"] == 20 + 32
