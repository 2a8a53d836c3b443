"""EAGLE draft heads: one decoder layer fed the target's hidden states.

Both heads share one interface used by tree drafting (`eagle.tree`):

- `extend(features, tokens)`: commit new positions. Draft position i consumes the target feature
  at sequence position i and the token at i + 1, and predicts the token at i + 2. Returns the
  head's output hidden state at the last new position and its log-probabilities there.
- `propose(hidden, tokens, parent_slots)`: draft one tree level tentatively. Each new node is
  fed its parent's draft hidden state (the head's own output, EAGLE's recurrence) and its token;
  it attends to the committed positions, to its ancestors among the tentative nodes and itself.
- `rollback()`: drop tentative nodes. `reset()`: drop everything.

Log-probabilities are over the head's own vocabulary; `to_target_ids` maps draft ids to target
ids (EAGLE-3: target = draft + d2t[draft]).
"""

from __future__ import annotations

import torch
from torch import nn

from compute.ragged import RowLengths, kept_columns
from eagle.config import DraftConfig
from eagle.modules import DraftAttention, DraftMLP, KVCache, RMSNorm, Rotary


class DraftHead(nn.Module):
    config: DraftConfig

    def __init__(self, config: DraftConfig):
        super().__init__()
        self.config = config
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings)
        self.cache = KVCache()

    # --- subclass hooks -------------------------------------------------------------------
    def layer_forward(self, embeds, features, cos, sin, mask, commit) -> torch.Tensor:
        raise NotImplementedError

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """Target features -> the width the layer takes (EAGLE-3: fc over the three taps)."""
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    # --- public interface -----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def reset(self) -> None:
        self.cache.reset()

    def rollback(self) -> None:
        self.cache.rollback()

    @torch.inference_mode()
    def extend(self, features: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features [n, F] target features, tokens [n] the tokens that follow them -> (hidden [H], logprobs [V_d])."""
        self.cache.rollback()
        start, n = self.cache.length, tokens.shape[0]
        positions = torch.arange(start, start + n, device=tokens.device)
        mask = None
        if start > 0:  # causal over the new block, full over the committed prefix
            mask = torch.ones(n, start + n, dtype=torch.bool, device=tokens.device).tril(start)[None, None]
        hidden = self._run(self.project_features(features.to(self.dtype))[None], tokens[None], positions[None], mask,
                           commit=True)[0]
        return hidden[-1], self.logprobs(hidden[-1])

    @torch.inference_mode()
    def propose(
        self, hidden: torch.Tensor, tokens: torch.Tensor, depth: int, ancestor_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One tentative tree level of k nodes.

        hidden [k, H]: the parents' draft outputs; tokens [k]: the nodes' draft ids; depth: their
        depth (1 = children of the root's prediction); ancestor_mask [k, t + k] bool over the t
        tentative entries already in the cache plus these k (True = ancestor or self), or None when
        every node sees all of them (a chain's one new node: every entry before it is an ancestor).
        Returns (hidden [k, H], logprobs [k, V_d]).
        """
        k = tokens.shape[0]
        committed = self.cache.length
        positions = torch.full((1, k), committed + depth - 1, device=tokens.device)
        mask = None  # one query, no mask: attention over the whole cache (`DraftAttention`)
        if ancestor_mask is not None:
            mask = torch.cat([torch.ones(k, committed, dtype=torch.bool, device=tokens.device), ancestor_mask],
                             dim=1)[None, None]
        elif k > 1:
            raise ValueError("ancestor_mask=None is for one node (a chain); pass the mask of several")
        out = self._run(hidden.to(self.dtype)[None], tokens[None], positions, mask, commit=False)[0]
        return out, self.logprobs(out)

    # --- batched decoding: B sequences of different lengths (`compute.ragged`) --------------------
    def reset_rows(self, batch: int, device: torch.device) -> None:
        """Forget everything and start B empty sequences. One is a single sequence (`reset`): the `*_rows`
        calls then run `extend` and `propose`, the computations of one sequence."""
        self.cache.reset(RowLengths.of([0] * batch, device) if batch > 1 else None)

    def select_rows(self, rows: list[int], rows_device: torch.Tensor) -> None:
        """Keep only these sequences of the batch (finished ones leave)."""
        self.cache.rollback()
        self.cache.select_rows(rows, rows_device)

    @torch.inference_mode()
    def extend_rows(self, features: torch.Tensor, tokens: torch.Tensor, counts: list[int],
                    counts_device: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`extend` for every row at once: row b commits its first counts[b] positions of
        features [B, m, F] and tokens [B, m] (the rest is padding). Returns each row's hidden [B, H]
        and logprobs [B, V_d] at its last new position."""
        if self.cache.rows is None:  # one sequence (`reset_rows(1)`)
            hidden, logprobs = self.extend(features[0, : counts[0]], tokens[0, : counts[0]])
            return hidden[None], logprobs[None]
        self.cache.rollback()
        rows, start = self.cache.rows, self.cache.length
        b, m = tokens.shape
        device = tokens.device
        positions = rows.device[:, None] + torch.arange(m, device=device)
        new = torch.ones(m, m, dtype=torch.bool, device=device).tril()
        mask = torch.cat([rows.prefix_visible(start)[:, None, :].expand(b, m, start), new.expand(b, m, m)], dim=2)
        hidden = self._run(self.project_features(features.to(self.dtype)), tokens, positions, mask[:, None],
                           commit=True)
        last = hidden.gather(1, (counts_device - 1)[:, None, None].expand(b, 1, hidden.shape[-1]))[:, 0]
        put = kept_columns(rows.device, counts_device, m)
        take = kept_columns(torch.full_like(rows.device, start), counts_device, m)
        self.cache.keep_rows(put, take, counts, counts_device)
        return last, self.logprobs(last)

    @torch.inference_mode()
    def propose_rows(self, hidden: torch.Tensor, tokens: torch.Tensor, depth: int,
                     ancestor_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """`propose` for every row at once: hidden [B, k, H], tokens [B, k], ancestor_mask [B, k, t + k]
        (or [k, t + k], the same for every row; None: k = 1, a chain's new node, which sees every tentative
        entry). Returns (hidden [B, k, H], logprobs [B, k, V_d])."""
        if self.cache.rows is None:  # one sequence (`reset_rows(1)`)
            mask = ancestor_mask if ancestor_mask is None or ancestor_mask.dim() == 2 else ancestor_mask[0]
            hidden, logprobs = self.propose(hidden[0], tokens[0], depth, mask)
            return hidden[None], logprobs[None]
        rows, committed = self.cache.rows, self.cache.length
        b, k = tokens.shape
        if ancestor_mask is None:
            if k > 1:
                raise ValueError("ancestor_mask=None is for one node per row (a chain); pass the mask of several")
            ancestor_mask = torch.ones(1, self.cache.total - committed + 1, dtype=torch.bool, device=tokens.device)
        positions = (rows.device + depth - 1)[:, None].expand(b, k)
        visible = rows.prefix_visible(committed)[:, None, :].expand(b, k, committed)
        mask = torch.cat([visible, ancestor_mask.expand(b, k, -1)], dim=2)
        out = self._run(hidden.to(self.dtype), tokens, positions, mask[:, None], commit=False)
        return out, self.logprobs(out)

    def logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits(hidden).float(), dim=-1)

    def _run(self, features, tokens, positions, mask, commit) -> torch.Tensor:
        """features [B, q, F'], tokens [B, q], positions [B, q], mask [B or 1, 1, q, kv] or None -> [B, q, H]."""
        b, q = tokens.shape
        cos, sin = self.rotary(positions.reshape(-1), self.dtype)
        cos, sin = cos.view(b, 1, q, -1), sin.view(b, 1, q, -1)
        return self.layer_forward(self.embed(tokens), features, cos, sin, mask, commit)


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer: attention over [norm(embedding) ; norm(feature)], residual on the feature."""

    def __init__(self, c: DraftConfig):
        super().__init__()
        self.self_attn = DraftAttention(
            2 * c.hidden_size, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        )
        self.mlp = DraftMLP(c.hidden_size, c.intermediate_size)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, embeds, hidden, cos, sin, mask, *, cache=None, commit=True, past=None):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attn, k, v = self.self_attn(x, cos, sin, mask, cache, commit, past)
        hidden = hidden + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), k, v


class Eagle3Head(DraftHead):
    """EAGLE-3: fuses three target layers with `fc`, predicts over a reduced draft vocabulary."""

    def __init__(self, config: DraftConfig):
        if config.kind != "eagle3":
            raise ValueError("Eagle3Head needs a config of kind 'eagle3'")
        super().__init__(config)
        c = config
        self.fc = nn.Linear(c.feature_size, c.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool) if c.draft_vocab_size == c.vocab_size
                             else torch.zeros(c.vocab_size, dtype=torch.bool))

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int | None = None, **overrides) -> Eagle3Head:
        """A randomly initialised head shaped for `target_config` (for tests and training).

        With a reduced `draft_vocab_size` the vocabulary map starts as the first ids; training
        code sets it from token frequencies with `set_draft_vocab`.
        """
        head = cls(DraftConfig.for_target(target_config, "eagle3", draft_vocab_size, **overrides))
        head.set_draft_vocab(torch.arange(head.config.draft_vocab_size))
        return head

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Choose which target ids the draft predicts (sorted ascending in the map)."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).sort().values
        if ids.numel() != self.config.draft_vocab_size or ids.unique().numel() != ids.numel():
            raise ValueError(f"need {self.config.draft_vocab_size} distinct target ids, got {ids.numel()}")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens)

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))

    def layer_forward(self, embeds, features, cos, sin, mask, commit):
        return self.midlayer(embeds, features, cos, sin, mask, cache=self.cache, commit=commit)[0]


class Eagle1Layer(nn.Module):
    """EAGLE-1/2's decoder layer: a Llama layer whose input layernorm is omitted."""

    def __init__(self, c: DraftConfig):
        super().__init__()
        self.self_attn = DraftAttention(
            c.hidden_size, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        )
        self.mlp = DraftMLP(c.hidden_size, c.intermediate_size)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, hidden, cos, sin, mask, *, cache=None, commit=True, past=None):
        attn, k, v = self.self_attn(hidden, cos, sin, mask, cache, commit, past)
        hidden = hidden + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), k, v


class Eagle1Head(DraftHead):
    """EAGLE-1/2: `fc` over [embedding ; feature], one layer, the target's own `lm_head`.

    The embedding and `lm_head` are the target's (frozen, not saved in the checkpoint).
    """

    def __init__(self, config: DraftConfig, embed_tokens: nn.Module, lm_head: nn.Module):
        if config.kind != "eagle1":
            raise ValueError("Eagle1Head needs a config of kind 'eagle1'")
        super().__init__(config)
        c = config
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=c.bias)
        self.layers = nn.ModuleList([Eagle1Layer(c)])
        # Held outside the module tree so that state_dict() is exactly the EAGLE checkpoint layout.
        self._target_parts = (embed_tokens, lm_head)

    @classmethod
    def for_target(cls, target_model, **overrides) -> Eagle1Head:
        config = DraftConfig.for_target(target_model.config, "eagle1", **overrides)
        return cls(config, target_model.get_input_embeddings(), target_model.get_output_embeddings())

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._target_parts[0](tokens).to(self.dtype)

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        return features  # fc needs the embedding too; applied in layer_forward

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        lm_head = self._target_parts[1]
        return lm_head(hidden.to(lm_head.weight.dtype))

    def layer_forward(self, embeds, features, cos, sin, mask, commit):
        x = self.fc(torch.cat([embeds, features], dim=-1))
        return self.layers[0](x, cos, sin, mask, cache=self.cache, commit=commit)[0]
