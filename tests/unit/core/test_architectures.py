"""Architectures: presets against published parameter counts, config.json parsing, name matching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kneepoint.core.architectures import (
    ModelArchitecture,
    architecture_from_mapping,
    architecture_from_spec,
    architecture_from_text,
    from_hf_config,
    get_preset,
    match_preset_for_model_name,
    preset_info,
    preset_names,
)
from kneepoint.core.spec import ArchitectureSpec, ConfigMapKeyRef

H200_DATA = Path(__file__).resolve().parents[2] / "data" / "h200"

REQUIRED_PRESETS = (
    "llama-3.2-1b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-405b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-72b",
    "mistral-7b",
    "mixtral-8x7b",
    "deepseek-v3",
)


def test_required_presets_are_shipped():
    assert set(REQUIRED_PRESETS) <= set(preset_names())


@pytest.mark.parametrize("name", preset_names())
def test_derived_parameter_count_matches_published_total(name):
    published = preset_info(name)["publishedParameters"]
    derived = get_preset(name).num_parameters
    assert abs(derived - published) / published <= 0.02, f"{name}: derived {derived:,} vs published {published:,}"


@pytest.mark.parametrize("name", [n for n in preset_names() if "publishedActiveParameters" in preset_info(n)])
def test_active_parameters_match_published(name):
    published = preset_info(name)["publishedActiveParameters"]
    assert abs(get_preset(name).active_parameters_per_token - published) / published <= 0.02


def test_dense_models_are_fully_active_and_moe_flags():
    dense = get_preset("llama-3-70b")
    assert dense.active_parameters_per_token == dense.num_parameters
    assert not dense.is_moe and not dense.uses_mla
    ds = get_preset("deepseek-v3")
    assert ds.is_moe and ds.uses_mla and ds.first_dense_layers == 3 and ds.num_moe_layers == 58
    assert get_preset("mixtral-8x7b").is_moe and not get_preset("mixtral-8x7b").uses_mla


def test_tied_embeddings_counted_once():
    tied = get_preset("llama-3.2-1b")
    untied = ModelArchitecture(**{**tied.to_dict(), "tie_word_embeddings": False})
    assert untied.num_parameters - tied.num_parameters == tied.vocab_size * tied.hidden_size


def test_qwen2_has_qkv_bias():
    qwen = get_preset("qwen2.5-7b")
    assert qwen.qkv_bias
    no_bias = ModelArchitecture(**{**qwen.to_dict(), "qkv_bias": False})
    bias = qwen.num_layers * (qwen.num_attention_heads + 2 * qwen.num_key_value_heads) * qwen.head_dim
    assert qwen.num_parameters - no_bias.num_parameters == bias


@pytest.mark.parametrize("model, preset", [("8b", "llama-3-8b"), ("70b", "llama-3-70b")])
def test_presets_have_the_measured_shapes(model, preset):
    """The H200 data used these Llama-3 shapes; the estimator's calibration depends on it."""
    data = json.loads((H200_DATA / f"llama{model}_tp1.json").read_text())
    shape = data["calls"]["call1"]["ranks"][0]["config"]
    arch = get_preset(preset)
    assert (
        arch.num_layers,
        arch.hidden_size,
        arch.num_attention_heads,
        arch.num_key_value_heads,
        arch.head_dim,
        arch.intermediate_size,
        arch.vocab_size,
    ) == (shape["layers"], shape["hidden"], shape["heads"], shape["kv_heads"], shape["head_dim"], shape["inter"], shape["vocab"])


# -- config.json parsing with real-world configs (values from the models' config.json files)

LLAMA31_8B_INSTRUCT = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 128256,
}
QWEN15_MOE_A27B = {
    "model_type": "qwen2_moe",
    "num_hidden_layers": 24,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "shared_expert_intermediate_size": 5632,
    "vocab_size": 151936,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
}
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2",
    "num_hidden_layers": 27,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "intermediate_size": 10944,
    "vocab_size": 102400,
    "tie_word_embeddings": False,
}


def test_llama_config_json_equals_preset():
    arch = from_hf_config(LLAMA31_8B_INSTRUCT, name="meta-llama/Llama-3.1-8B-Instruct")
    preset = get_preset("llama-3-8b")
    assert dict(arch.to_dict(), name="x") == dict(preset.to_dict(), name="x")


@pytest.mark.parametrize(
    "config, total, active",
    [(QWEN15_MOE_A27B, 14.3e9, 2.7e9), (QWEN3_30B_A3B, 30.5e9, 3.3e9), (DEEPSEEK_V2_LITE, 15.7e9, None)],
    ids=["qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "deepseek-v2-lite"],
)
def test_moe_configs_match_published_sizes(config, total, active):
    arch = from_hf_config(config)
    assert arch.is_moe
    assert abs(arch.num_parameters - total) / total <= 0.02
    if active:
        assert abs(arch.active_parameters_per_token - active) / active <= 0.05


def test_deepseek_v2_lite_mla_without_q_lora():
    arch = from_hf_config(DEEPSEEK_V2_LITE)
    assert arch.uses_mla and arch.q_lora_rank == 0 and arch.head_dim == 192
    assert arch.first_dense_layers == 1 and arch.num_shared_experts == 2
    assert arch.kv_values_per_token_per_layer(1) == arch.kv_values_per_token_per_layer(8) == 512 + 64


def test_mixtral_expert_size_comes_from_intermediate_size():
    arch = get_preset("mixtral-8x7b")
    assert arch.moe_intermediate_size == arch.intermediate_size == 14336
    assert arch.num_experts == 8 and arch.num_experts_per_token == 2 and arch.first_dense_layers == 0


def test_qwen2_moe_dense_layers_from_mlp_only_layers_and_sparse_step():
    arch = from_hf_config({**QWEN15_MOE_A27B, "mlp_only_layers": [0, 1]})
    assert arch.first_dense_layers == 2
    arch = from_hf_config({**QWEN15_MOE_A27B, "decoder_sparse_step": 2})
    assert arch.num_moe_layers == 12


def test_multimodal_text_config_is_used():
    arch = from_hf_config({"model_type": "llava", "text_config": LLAMA31_8B_INSTRUCT, "_name_or_path": "x/y"})
    assert arch.num_layers == 32 and arch.name == "x/y"


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size"])
def test_missing_key_is_named(key):
    config = dict(LLAMA31_8B_INSTRUCT)
    del config[key]
    with pytest.raises(ValueError, match=key):
        from_hf_config(config)


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="hidden_size"):
        from_hf_config({**LLAMA31_8B_INSTRUCT, "hidden_size": "4096"})
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        from_hf_config({k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts_per_tok"})
    with pytest.raises(ValueError, match="JSON object"):
        from_hf_config([1, 2])  # type: ignore[arg-type]


def test_defaults_for_optional_keys():
    config = {k: v for k, v in LLAMA31_8B_INSTRUCT.items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    arch = from_hf_config(config)
    assert arch.num_key_value_heads == 32 and arch.head_dim == 128 and not arch.tie_word_embeddings


# -- presets and names


def test_unknown_preset_names_known_ones():
    with pytest.raises(KeyError) as info:
        get_preset("llama-9")
    assert "llama-3-70b" in info.value.args[0] and "deepseek-v3" in info.value.args[0]


@pytest.mark.parametrize(
    "model_name, preset",
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-8b"),
        ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
        ("hf://meta-llama/Llama-3.3-70B-Instruct", "llama-3-70b"),
        ("meta-llama/Llama-3.1-405B-Instruct-FP8", "llama-3.1-405b"),
        ("meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b"),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("Qwen/Qwen2.5-14B", "qwen2.5-14b"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
        ("sim://llama-3-70b", "llama-3-70b"),
        ("pvc://models/llama_3_8b", "llama-3-8b"),
        ("meta-llama/Llama-3.2-11B-Vision", None),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", None),
        ("mistralai/Mixtral-8x22B-v0.1", None),
        ("", None),
    ],
)
def test_match_preset_for_model_name(model_name, preset):
    assert match_preset_for_model_name(model_name) == preset


# -- from the spec and from text


def test_architecture_from_spec_sources():
    assert architecture_from_spec(ArchitectureSpec(preset="llama-3-70b")) == get_preset("llama-3-70b")
    ref = ArchitectureSpec(config_map_ref=ConfigMapKeyRef(name="llama", key="config.json"))
    arch = architecture_from_spec(ref, json.dumps(LLAMA31_8B_INSTRUCT))
    assert arch.num_parameters == get_preset("llama-3-8b").num_parameters and arch.name == "llama/config.json"
    assert architecture_from_spec(ref, LLAMA31_8B_INSTRUCT).num_layers == 32
    explicit = architecture_from_spec(
        ArchitectureSpec(
            num_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, vocab_size=128256
        )
    )
    assert explicit.num_parameters == get_preset("llama-3-8b").num_parameters
    override = architecture_from_spec(
        ArchitectureSpec(
            num_layers=32,
            hidden_size=4096,
            num_attention_heads=32,
            intermediate_size=14336,
            vocab_size=128256,
            num_parameters=9_000_000_000,
        )
    )
    assert override.num_parameters == 9_000_000_000 and override.parameter_scale > 1
    assert architecture_from_spec(ArchitectureSpec(), model_name="hf://meta-llama/Llama-3.1-8B") == get_preset("llama-3-8b")


@pytest.mark.parametrize(
    "spec, config_json, message",
    [
        (ArchitectureSpec(preset="nope"), None, r"spec\.model\.architecture\.preset: unknown preset 'nope'; known: .*llama-3-8b"),
        (ArchitectureSpec(config_map_ref=ConfigMapKeyRef(name="cm")), None, r"configMapRef: the content of ConfigMap 'cm'"),
        (ArchitectureSpec(config_map_ref=ConfigMapKeyRef(name="cm")), "{not json", r"configMapRef: .*is not JSON"),
        (ArchitectureSpec(config_map_ref=ConfigMapKeyRef(name="cm")), "{}", r"configMapRef: config.json: missing 'num_hidden_layers'"),
        (ArchitectureSpec(num_layers=2, hidden_size=8, num_attention_heads=2, intermediate_size=8), None, r"architecture\.vocabSize"),
        (
            ArchitectureSpec(num_layers=2, hidden_size=8, num_attention_heads=2, intermediate_size=8, vocab_size=10, num_experts=4),
            None,
            r"numExpertsPerToken",
        ),
        (ArchitectureSpec(), None, r"give a preset, a configMapRef or explicit numbers"),
    ],
)
def test_architecture_from_spec_errors_name_the_field(spec, config_json, message):
    with pytest.raises(ValueError, match=message):
        architecture_from_spec(spec, config_json)


def test_unmatched_model_name_is_explained():
    with pytest.raises(ValueError, match="matches no preset"):
        architecture_from_spec(ArchitectureSpec(), model_name="hf://org/unknown-model")


def test_architecture_from_text_round_trips():
    for name in preset_names():
        arch = get_preset(name)
        assert architecture_from_text(json.dumps(arch.to_dict())) == arch
        assert architecture_from_text(name) == arch
    assert architecture_from_text(json.dumps(LLAMA31_8B_INSTRUCT)).num_layers == 32
    with pytest.raises(ValueError, match="known: "):
        architecture_from_text("gpt-5")
    with pytest.raises(ValueError, match="does not parse"):
        architecture_from_text("{bad")
    with pytest.raises(ValueError, match="unknown field"):
        architecture_from_mapping({"num_layers": 2, "colour": "red"})


def test_invalid_shapes_are_refused():
    base = get_preset("llama-3-8b").to_dict()
    with pytest.raises(ValueError, match="hidden_size"):
        ModelArchitecture(**{**base, "hidden_size": 0})
    with pytest.raises(ValueError, match="num_experts_per_token"):
        ModelArchitecture(**{**base, "num_experts": 8, "num_experts_per_token": 9, "moe_intermediate_size": 10})
