"""What the draft side reads off configs: the draft head's own `DraftConfig` (the public EAGLE
`config.json` fields), the target's text config, its stop tokens, and whether a draft fits a target."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path


def text_config(config):
    """The decoder text config of a Hugging Face config (multimodal configs nest it); else the config itself."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def cache_keyword(model) -> str:
    """The keyword a model's forward takes its KV cache by: `cache` where it has one (transformers
    >= 5.24, which deprecates `past_key_values` for removal in 5.40), else `past_key_values` (5.0-5.23)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def eos_token_ids(model=None, tokenizer=None, eos_token_id: int | list[int] | None = None) -> frozenset[int]:
    """The token ids that end a generation, in one place for decoding, evaluation and training data.

    An explicit `eos_token_id` (an id or a list of ids) is used as given. Otherwise the union of the
    model's `generation_config.eos_token_id` (chat models often list several, e.g. Llama-3's
    <|eot_id|> and <|end_of_text|>) and the tokenizer's `eos_token_id`; empty when neither has one.
    """
    if eos_token_id is not None:
        return frozenset([int(eos_token_id)] if isinstance(eos_token_id, int) else map(int, eos_token_id))
    ids: set[int] = set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if config_eos is not None:
        ids |= {int(config_eos)} if isinstance(config_eos, int) else set(map(int, config_eos))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


@dataclass
class DraftConfig:
    """What a draft head needs to know. Field names follow the published EAGLE `config.json`.

    `feature_layers` (ours; absent from published checkpoints, then derived) are indices into the
    target's `hidden_states` tuple, i.e. the hidden state *entering* that decoder layer. EAGLE-3's
    choice for an L-layer target is (2, L // 2, L - 3). EAGLE-1/2 heads use the target's final
    (post-norm) hidden state, which is what the target's `lm_head` reads.
    """

    kind: str  # "eagle3" or "eagle1"
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    num_target_layers: int
    target_hidden_size: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    bias: bool = True  # EAGLE-1 `fc` bias
    feature_layers: list[int] = field(default_factory=list)
    # Ours: the temperature the head's log-probabilities are taken at when they *rank* tree nodes
    # (EAGLE-2's draft confidence, `eagle.tree.confidence_logprobs`), fitted so that a candidate's confidence
    # matches its chance of acceptance (`python -m eagle.train.confidence`). 1.0: the head as trained.
    confidence_temperature: float = 1.0

    def __post_init__(self):
        if self.kind not in ("eagle3", "eagle1"):
            raise ValueError(f"kind must be 'eagle3' or 'eagle1', got {self.kind!r}")
        if not (isinstance(self.confidence_temperature, (int, float)) and 0 < self.confidence_temperature < math.inf):
            raise ValueError(f"confidence_temperature must be a finite number > 0, got {self.confidence_temperature!r} "
                             "(1.0: rank tree nodes by the head's own log-probabilities)")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if not self.feature_layers and self.kind == "eagle3":
            n = self.num_target_layers
            self.feature_layers = [2, n // 2, n - 3] if n >= 4 else [n] * 3
        if not self.feature_layers and self.kind == "eagle1":
            self.feature_layers = [self.num_target_layers]

    @property
    def feature_size(self) -> int:
        """Width of the target feature the head consumes."""
        width = self.target_hidden_size or self.hidden_size
        return width * len(self.feature_layers)

    @classmethod
    def for_target(cls, target_config, kind: str, draft_vocab_size: int | None = None, **overrides) -> DraftConfig:
        tc = text_config(target_config)
        rope_theta = getattr(tc, "rope_theta", None)
        rope_params = getattr(tc, "rope_parameters", None) or {}
        if rope_theta is None:
            rope_theta = rope_params.get("rope_theta", 10000.0)
        values = dict(
            kind=kind,
            hidden_size=tc.hidden_size,
            intermediate_size=tc.intermediate_size,
            num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
            head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
            vocab_size=tc.vocab_size,
            draft_vocab_size=draft_vocab_size or tc.vocab_size,
            num_target_layers=tc.num_hidden_layers,
            rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=getattr(tc, "max_position_embeddings", 2048),
        )
        values.update(overrides)
        return cls(**values)

    def to_json(self) -> dict:
        """Public EAGLE fields plus ours (`kind`, `num_target_layers`, `feature_layers`, `confidence_temperature`)."""
        d = dataclasses.asdict(self)
        d["architectures"] = ["LlamaForCausalLMEagle3" if self.kind == "eagle3" else "LlamaForCausalLM"]
        d["num_hidden_layers"] = 1
        d["hidden_act"] = "silu"
        return d

    @classmethod
    def from_json(cls, d: dict, num_target_layers: int | None = None) -> DraftConfig:
        """Read a published or our own config.json. `num_target_layers` fills in what they lack."""
        kind = d.get("kind") or ("eagle3" if "draft_vocab_size" in d else "eagle1")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"draft hidden_act {d['hidden_act']!r} is not supported (only silu)")
        if kind == "eagle3" and "draft_vocab_size" not in d:
            raise ValueError("EAGLE-3 draft config.json lacks the required field 'draft_vocab_size'")
        n_layers = d.get("num_target_layers") or num_target_layers
        if n_layers is None:
            raise ValueError("draft config has no 'num_target_layers'; pass the target model to load_draft")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in names}
        values.update(kind=kind, num_target_layers=n_layers)
        values.setdefault("draft_vocab_size", d["vocab_size"])
        values.setdefault("num_key_value_heads", d.get("num_attention_heads"))
        return cls(**values)

    def check_target(self, target_model) -> None:
        """Raise a ValueError naming the mismatch when this draft does not fit `target_model`."""
        tc = text_config(target_model.config)
        target_vocab = target_model.get_output_embeddings().weight.shape[0]
        if self.vocab_size != target_vocab:
            raise ValueError(
                f"draft vocab_size {self.vocab_size} != target vocabulary {target_vocab}: this draft was trained "
                "for another target model. Load the draft trained for this target."
            )
        expected = self.target_hidden_size or self.hidden_size
        if expected != tc.hidden_size:
            raise ValueError(
                f"draft expects target hidden size {expected}, but the target has hidden_size {tc.hidden_size}: "
                "this draft was trained for another target model (set target_hidden_size only if that is intended)."
            )
        if self.kind == "eagle1" and self.hidden_size != tc.hidden_size:
            raise ValueError("an EAGLE-1 draft feeds the target's lm_head, so its hidden_size must equal the target's")
        bad = [i for i in self.feature_layers if not 0 <= i <= tc.num_hidden_layers]
        if bad:
            raise ValueError(
                f"draft feature_layers {bad} are outside the target's 0..{tc.num_hidden_layers} hidden states")

    def save(self, directory: str | Path) -> None:
        Path(directory, "config.json").write_text(json.dumps(self.to_json(), indent=2))
