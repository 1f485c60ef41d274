"""Model architectures: the shape numbers the memory estimator and the simulator need.

A :class:`ModelArchitecture` comes from one of three places, as the experiment spec allows:
a named preset (``kneepoint/data/architectures.json``, stored as the relevant subset of each
model's Hugging Face ``config.json``), a ``config.json`` read from a ConfigMap, or explicit
numbers in ``spec.model.architecture``. Dense Llama/Qwen/Mistral-style models, MoE models
(Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3) and DeepSeek's multi-head latent attention (MLA)
are covered.

The parameter accounting is written once, as a list of weight groups per layer, each
marked with how tensor parallelism treats it (split, split by KV head, replicated) and
whether a quantized checkpoint stores it quantized. The parameter count, the active
parameters per token and the estimator's bytes per GPU are all sums over that one list,
so they cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kneepoint.core.catalog_files import load_data_file

# How tensor parallelism treats a weight group (mirrors vLLM's parallel linear layers).
SPLIT = "split"
"""Column/row-parallel or vocab-parallel: each of TP ranks holds 1/TP."""
SPLIT_BY_KV_HEAD = "kv"
"""K/V projections: split by KV head, and replicated once TP exceeds the KV-head count."""
REPLICATED = "replicated"
"""Norms, routers, MLA down-projections: every rank holds a full copy."""


@dataclass(frozen=True)
class WeightGroup:
    """A set of weights that tensor parallelism treats the same way."""

    name: str
    parameters: int
    split: str
    quantizable: bool
    """True for linear-layer weights, which an fp8/int8/int4 checkpoint stores quantized;
    embeddings, lm_head, norms, biases and MoE routers stay in 16-bit (as vLLM loads them)."""
    expert: bool = False
    """A routed expert's weights (only num_experts_per_token of them are active per token)."""


@dataclass(frozen=True)
class ModelArchitecture:
    """The shape of a decoder-only transformer, enough to count weights and KV cache."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    """Per-head size of queries and keys (for MLA: qk_nope_head_dim + qk_rope_head_dim)."""
    intermediate_size: int
    """MLP intermediate size of the dense layers."""
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    """Biases on the q/k/v projections (Qwen2)."""
    # Mixture of experts (0 = dense).
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    """Total intermediate size of the shared expert(s); 0 means num_shared_experts x moe_intermediate_size."""
    first_dense_layers: int = 0
    """Layers with a dense MLP before the MoE layers start (DeepSeek's first_k_dense_replace)."""
    # Multi-head latent attention (DeepSeek-V2/V3; 0 = ordinary attention).
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    num_parameters_override: int | None = None
    """A published total; when set, :attr:`num_parameters` returns it and weight bytes are scaled to it."""

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"architecture {self.name!r}: {f} must be a positive integer, got {value!r}")
        if self.num_experts and not (1 <= self.num_experts_per_token <= self.num_experts):
            raise ValueError(
                f"architecture {self.name!r}: num_experts_per_token must be between 1 and num_experts ({self.num_experts}), "
                f"got {self.num_experts_per_token}"
            )
        if self.num_experts and self.moe_intermediate_size < 1:
            raise ValueError(f"architecture {self.name!r}: moe_intermediate_size must be a positive integer for an MoE model")
        if not 0 <= self.first_dense_layers <= self.num_layers:
            raise ValueError(f"architecture {self.name!r}: first_dense_layers must be between 0 and num_layers ({self.num_layers})")
        if self.kv_lora_rank and self.qk_rope_head_dim < 1:
            raise ValueError(f"architecture {self.name!r}: MLA (kv_lora_rank) needs qk_rope_head_dim")

    # -- classification
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def shared_intermediate_size(self) -> int:
        return self.shared_expert_intermediate_size or self.num_shared_experts * self.moe_intermediate_size

    # -- parameter accounting
    def attention_groups(self) -> tuple[WeightGroup, ...]:
        """Weights of one attention block plus the layer's two norms."""
        d, h = self.hidden_size, self.num_attention_heads
        groups: list[WeightGroup] = [WeightGroup("norms", 2 * d, REPLICATED, False)]
        if self.uses_mla:
            nope = self.qk_nope_head_dim or (self.head_dim - self.qk_rope_head_dim)
            v = self.v_head_dim or nope
            qk = nope + self.qk_rope_head_dim
            if self.q_lora_rank:
                groups += [
                    WeightGroup("q_a_proj", d * self.q_lora_rank, REPLICATED, True),
                    WeightGroup("q_a_layernorm", self.q_lora_rank, REPLICATED, False),
                    WeightGroup("q_b_proj", self.q_lora_rank * h * qk, SPLIT, True),
                ]
            else:
                groups.append(WeightGroup("q_proj", d * h * qk, SPLIT, True))
            groups += [
                WeightGroup("kv_a_proj_with_mqa", d * (self.kv_lora_rank + self.qk_rope_head_dim), REPLICATED, True),
                WeightGroup("kv_a_layernorm", self.kv_lora_rank, REPLICATED, False),
                WeightGroup("kv_b_proj", self.kv_lora_rank * h * (nope + v), SPLIT, True),
                WeightGroup("o_proj", h * v * d, SPLIT, True),
            ]
            return tuple(groups)
        hd, kv = self.head_dim, self.num_key_value_heads
        groups += [
            WeightGroup("q_proj+o_proj", 2 * d * h * hd, SPLIT, True),
            WeightGroup("k_proj+v_proj", 2 * d * kv * hd, SPLIT_BY_KV_HEAD, True),
        ]
        if self.qkv_bias:
            groups += [WeightGroup("q_bias", h * hd, SPLIT, False), WeightGroup("kv_bias", 2 * kv * hd, SPLIT_BY_KV_HEAD, False)]
        return tuple(groups)

    def mlp_groups(self, moe: bool) -> tuple[WeightGroup, ...]:
        """Weights of one MLP block: dense (gate, up, down) or MoE (router, experts, shared experts)."""
        d = self.hidden_size
        if not moe:
            return (WeightGroup("mlp", 3 * d * self.intermediate_size, SPLIT, True),)
        groups = [
            WeightGroup("router", d * self.num_experts, REPLICATED, False),
            WeightGroup("experts", self.num_experts * 3 * d * self.moe_intermediate_size, SPLIT, True, expert=True),
        ]
        if self.shared_intermediate_size:
            groups.append(WeightGroup("shared_experts", 3 * d * self.shared_intermediate_size, SPLIT, True))
        return tuple(groups)

    def layer_groups(self, layer_index: int) -> tuple[WeightGroup, ...]:
        moe = self.is_moe and layer_index >= self.first_dense_layers
        return self.attention_groups() + self.mlp_groups(moe)

    def embedding_groups(self, *, first_stage: bool = True, last_stage: bool = True) -> tuple[WeightGroup, ...]:
        """Embedding (first pipeline stage), final norm and lm_head (last stage).

        With tied embeddings and one stage, lm_head is the embedding itself; across stages
        the last one holds its own copy (vLLM loads the same tensor on both ends).
        """
        vd = self.vocab_size * self.hidden_size
        groups: list[WeightGroup] = []
        if first_stage:
            groups.append(WeightGroup("embed_tokens", vd, SPLIT, False))
        if last_stage:
            groups.append(WeightGroup("final_norm", self.hidden_size, REPLICATED, False))
            if not (self.tie_word_embeddings and first_stage):
                groups.append(WeightGroup("lm_head", vd, SPLIT, False))
        return tuple(groups)

    def all_groups(self) -> tuple[WeightGroup, ...]:
        groups: list[WeightGroup] = list(self.embedding_groups())
        for i in range(self.num_layers):
            groups += self.layer_groups(i)
        return tuple(groups)

    @property
    def derived_num_parameters(self) -> int:
        """Parameters counted from the shape (ignores the override)."""
        return sum(g.parameters for g in self.all_groups())

    @property
    def num_parameters(self) -> int:
        """Total parameters: the override when given, else the count derived from the shape."""
        return self.num_parameters_override or self.derived_num_parameters

    @property
    def parameter_scale(self) -> float:
        """Override / derived count: applied to weight bytes so a published total wins."""
        if not self.num_parameters_override:
            return 1.0
        return self.num_parameters_override / self.derived_num_parameters

    @property
    def active_parameters_per_token(self) -> int:
        """Parameters one token passes through: routed experts count only num_experts_per_token of num_experts."""
        total = 0
        for g in self.all_groups():
            if g.expert:
                total += g.parameters * self.num_experts_per_token // self.num_experts
            else:
                total += g.parameters
        return round(total * self.parameter_scale)

    # -- KV cache
    def kv_values_per_token_per_layer(self, tensor_parallel: int = 1) -> int:
        """Cached values (not bytes) per token per layer on one GPU.

        Ordinary attention stores K and V for the rank's KV heads; vLLM replicates KV heads
        when TP exceeds their number, so a rank never holds fewer than one. MLA stores one
        compressed latent plus the rotary key, the same on every rank (not split by TP).
        """
        if self.uses_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * kv_heads_per_rank(self.num_key_value_heads, tensor_parallel) * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (snake_case field names); :func:`architecture_from_mapping` reads it back."""
        return dataclasses.asdict(self)


def kv_heads_per_rank(num_key_value_heads: int, tensor_parallel: int) -> int:
    """KV heads one TP rank holds: split when possible, at least one (replicated) otherwise."""
    return max(1, math.ceil(num_key_value_heads / tensor_parallel))


# ---------------------------------------------------------------------------------------
# Reading Hugging Face config.json


_REQUIRED_HF_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
_QKV_BIAS_MODEL_TYPES = ("qwen2", "qwen2_moe")


def _hf_int(config: Mapping[str, Any], key: str, default: int | None = None, *, where: str = "config.json") -> int:
    value = config.get(key)
    if value is None:
        if default is None:
            raise ValueError(
                f"{where}: missing {key!r} (needed: {', '.join(_REQUIRED_HF_KEYS)}, and intermediate_size or an MoE expert size)"
            )
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 0:
        raise ValueError(f"{where}: {key!r} must be a non-negative integer, got {value!r}")
    return int(value)


def from_hf_config(config: Mapping[str, Any], name: str | None = None) -> ModelArchitecture:
    """Build an architecture from a Hugging Face ``config.json`` mapping.

    Reads Llama/Qwen2/Qwen3/Mistral keys, Mixtral's ``num_local_experts``, Qwen2/Qwen3-MoE's
    ``num_experts``/``shared_expert_intermediate_size``/``mlp_only_layers`` and DeepSeek-V2/V3's
    ``n_routed_experts``/``n_shared_experts``/``first_k_dense_replace`` and MLA ranks. A
    multimodal wrapper's ``text_config`` is used when the top level has no layer count.
    Raises ``ValueError`` naming the missing or malformed key.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config.json must be a JSON object, got {type(config).__name__}")
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), Mapping):
        config = {**config["text_config"], "_name_or_path": config.get("_name_or_path")}
    model_type = str(config.get("model_type") or "")
    name = name or str(config.get("_name_or_path") or model_type or "config.json")
    layers = _hf_int(config, "num_hidden_layers")
    hidden = _hf_int(config, "hidden_size")
    heads = _hf_int(config, "num_attention_heads")
    vocab = _hf_int(config, "vocab_size")
    kv_heads = _hf_int(config, "num_key_value_heads", heads)

    # MoE: the key naming the routed-expert count differs per family.
    experts = 0
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if config.get(key):
            experts = _hf_int(config, key)
            break
    top_k = _hf_int(config, "num_experts_per_tok", 0) if experts else 0
    if experts and not top_k:
        raise ValueError("config.json: missing 'num_experts_per_tok' for an MoE model (it has routed experts)")
    if experts and "moe_intermediate_size" in config:
        moe_inter = _hf_int(config, "moe_intermediate_size")
        inter = _hf_int(config, "intermediate_size", moe_inter)
    elif experts:  # Mixtral: intermediate_size is the expert size, every layer is MoE.
        inter = _hf_int(config, "intermediate_size")
        moe_inter = inter
    else:
        inter = _hf_int(config, "intermediate_size")
        moe_inter = 0

    shared_experts = _hf_int(config, "n_shared_experts", 0) if experts else 0
    shared_inter = _hf_int(config, "shared_expert_intermediate_size", 0) if experts else 0
    first_dense = 0
    if experts:
        first_dense = _hf_int(config, "first_k_dense_replace", 0)
        # Qwen2/3-MoE: layers listed in mlp_only_layers, or off the sparse step, are dense.
        sparse_step = _hf_int(config, "decoder_sparse_step", 1) or 1
        mlp_only = set(config.get("mlp_only_layers") or ())
        moe_freq = _hf_int(config, "moe_layer_freq", 1) or 1
        dense_count = sum(1 for i in range(layers) if i < first_dense or i in mlp_only or (i + 1) % sparse_step != 0 or i % moe_freq != 0)
        first_dense = dense_count  # position does not change totals; the PP split treats them as leading layers
        if dense_count == layers:
            experts, top_k, moe_inter, shared_experts, shared_inter = 0, 0, 0, 0, 0

    kv_lora = _hf_int(config, "kv_lora_rank", 0)
    rope = _hf_int(config, "qk_rope_head_dim", 0) if kv_lora else 0
    nope = _hf_int(config, "qk_nope_head_dim", 0) if kv_lora else 0
    if kv_lora:
        head_dim = nope + rope
        if head_dim < 1:
            raise ValueError("config.json: MLA model (kv_lora_rank) needs 'qk_nope_head_dim' and 'qk_rope_head_dim'")
    else:
        head_dim = _hf_int(config, "head_dim", 0) or hidden // heads
    bias = config.get("attention_bias")
    qkv_bias = bool(bias) if bias is not None else model_type in _QKV_BIAS_MODEL_TYPES
    return ModelArchitecture(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias and not kv_lora,
        num_experts=experts,
        num_experts_per_token=top_k,
        moe_intermediate_size=moe_inter,
        num_shared_experts=shared_experts,
        shared_expert_intermediate_size=shared_inter,
        first_dense_layers=first_dense,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        q_lora_rank=_hf_int(config, "q_lora_rank", 0) if kv_lora else 0,
        qk_nope_head_dim=nope,
        v_head_dim=_hf_int(config, "v_head_dim", 0) if kv_lora else 0,
    )


# ---------------------------------------------------------------------------------------
# Presets


def _preset_rows() -> list[dict[str, Any]]:
    return list(load_data_file("architectures.json")["presets"])


def preset_names() -> tuple[str, ...]:
    """Names of the shipped presets, in catalogue order."""
    return tuple(row["name"] for row in _preset_rows())


def preset_info(name: str) -> dict[str, Any]:
    """The catalogue row of a preset (display name, source, published parameter count)."""
    wanted = name.strip().lower()
    for row in _preset_rows():
        if row["name"] == wanted:
            return row
    raise KeyError(f"unknown architecture preset {name!r}; known: {', '.join(preset_names())}")


def get_preset(name: str) -> ModelArchitecture:
    """The preset's architecture; ``KeyError`` naming the known presets for an unknown name."""
    row = preset_info(name)
    return from_hf_config(row["config"], name=row["name"])


def _normalise_model_name(name: str) -> str:
    text = name.strip().lower()
    text = re.sub(r"^[a-z]+://", "", text)
    text = text.rstrip("/").rsplit("/", 1)[-1]
    return text.replace("_", "-")


def match_preset_for_model_name(name: str) -> str | None:
    """The preset a model name refers to, or None.

    ``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3-8b``; ``hf://Qwen/Qwen2.5-72B-Instruct``
    -> ``qwen2.5-72b``; ``sim://llama-3-70b`` -> ``llama-3-70b``. Matching uses each preset's
    ``modelNamePatterns`` (regular expressions over the lower-cased last path segment).
    """
    text = _normalise_model_name(name)
    if not text:
        return None
    names: list[tuple[str, Any]] = [(row["name"], row.get("modelNamePatterns", ())) for row in _preset_rows()]
    for preset, _ in names:
        if text == preset:
            return preset
    for preset, patterns in names:
        if any(re.search(pattern, text) for pattern in patterns):
            return preset
    return None


# ---------------------------------------------------------------------------------------
# From the experiment spec, and from text (the simulator's --architecture)

_OWN_FIELDS = {f.name for f in dataclasses.fields(ModelArchitecture)}


def architecture_from_mapping(data: Mapping[str, Any], name: str | None = None) -> ModelArchitecture:
    """Read either :meth:`ModelArchitecture.to_dict` output (has ``num_layers``) or a Hugging Face config.json."""
    if "num_layers" in data and "num_hidden_layers" not in data:
        unknown = sorted(set(data) - _OWN_FIELDS)
        if unknown:
            raise ValueError(f"architecture JSON: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_OWN_FIELDS))}")
        fields = dict(data)
        fields.setdefault("name", name or "custom")
        try:
            return ModelArchitecture(**fields)
        except TypeError as exc:  # a required field is missing
            raise ValueError(f"architecture JSON: {exc}") from None
    return from_hf_config(data, name=name)


def architecture_from_text(text: str) -> ModelArchitecture:
    """A preset name or inline JSON (HF config.json or :meth:`ModelArchitecture.to_dict`), as the simulator's
    ``--architecture`` and ``KNEEPOINT_SIM_ARCHITECTURE`` carry it. Reading a file is the caller's job."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"architecture JSON does not parse: {exc.msg} at character {exc.pos}") from None
        return architecture_from_mapping(data)
    try:
        return get_preset(stripped)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def architecture_from_spec(
    spec_architecture: Any, config_json: str | Mapping[str, Any] | None = None, *, model_name: str | None = None
) -> ModelArchitecture:
    """Resolve ``spec.model.architecture`` (a :class:`kneepoint.core.spec.ArchitectureSpec`).

    - ``preset``: the named preset;
    - ``configMapRef``: ``config_json`` is the ConfigMap's value (JSON text or a parsed mapping),
      read by the caller (the core does no I/O);
    - explicit numbers: built from them (head_dim defaults to hidden/heads, KV heads to heads);
    - nothing: the preset matching ``model_name`` (the model URI), if any.
    Raises ``ValueError`` naming the spec field.
    """
    base = "spec.model.architecture"
    if spec_architecture.preset is not None:
        try:
            return get_preset(spec_architecture.preset)
        except KeyError:
            raise ValueError(f"{base}.preset: unknown preset {spec_architecture.preset!r}; known: {', '.join(preset_names())}") from None
    if spec_architecture.config_map_ref is not None:
        ref = spec_architecture.config_map_ref
        if config_json is None:
            raise ValueError(f"{base}.configMapRef: the content of ConfigMap {ref.name!r} key {ref.key!r} was not provided")
        config: Any = config_json  # from_hf_config checks that it is an object
        if isinstance(config_json, str):
            try:
                config = json.loads(config_json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{base}.configMapRef: ConfigMap {ref.name!r} key {ref.key!r} is not JSON ({exc.msg})") from None
        try:
            return from_hf_config(config, name=f"{ref.name}/{ref.key}")
        except ValueError as exc:
            raise ValueError(f"{base}.configMapRef: {exc}") from None
    a = spec_architecture
    if a.num_layers is not None:
        missing = [f for f in ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size") if getattr(a, f) is None]
        if missing:
            from kneepoint.core.apifields import camel

            raise ValueError(f"{base}.{camel(missing[0])}: is required when the shape is given as numbers")
        experts = a.num_experts or 0
        if experts and a.num_experts_per_token is None:
            raise ValueError(f"{base}.numExpertsPerToken: is required when numExperts is given")
        try:
            return ModelArchitecture(
                name="custom",
                num_layers=a.num_layers,
                hidden_size=a.hidden_size,
                num_attention_heads=a.num_attention_heads,
                num_key_value_heads=a.num_key_value_heads or a.num_attention_heads,
                head_dim=a.head_dim or a.hidden_size // a.num_attention_heads,
                intermediate_size=a.intermediate_size,
                vocab_size=a.vocab_size,
                num_experts=experts,
                num_experts_per_token=a.num_experts_per_token or 0,
                moe_intermediate_size=(a.moe_intermediate_size or a.intermediate_size) if experts else 0,
                num_parameters_override=a.num_parameters,
            )
        except ValueError as exc:
            raise ValueError(f"{base}: {exc}") from None
    if model_name:
        matched = match_preset_for_model_name(model_name)
        if matched:
            return get_preset(matched)
        raise ValueError(
            f"{base}: not given and model {model_name!r} matches no preset; set preset (one of {', '.join(preset_names())}), "
            "configMapRef or explicit numbers"
        )
    raise ValueError(f"{base}: give a preset, a configMapRef or explicit numbers")
