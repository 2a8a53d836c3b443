"""Benchmark questions and how they become token ids.

Two file formats, both JSON lines:
  - the public speculative-decoding sets (MT-bench, HumanEval, GSM8K, Alpaca, CNN/DM, NQ, WMT19,
    AIME 2025) as collected by the EAGLE / MARS releases: `question_id`, `category`, `turns`;
  - the project's own held-out stdlib prompts (`eval.prompts`): `question_id`, `file`, `name`, `prompt`.

How a question becomes a prompt is the model's `PromptFormat` (the `prompt:` block of a model
config): "chat" uses the tokenizer's chat template (Qwen3's thinking switch passed through),
"fastchat" a FastChat conversation template for models that have none (Vicuna v1.1, Llama-2-chat),
"completion" raw text continued by a base model, after the tokenizer's BOS (the embedded code model;
HumanEval then gets the function header and docstring from HumanEval.jsonl.gz). Turn n of a
multi-turn question is asked after the model's own answers to the earlier turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eval.benchmarks.questions import Question
from eval.config.schema import PromptConfig

PROMPT_KINDS = ("chat", "fastchat", "completion")
PROMPT_KEYS = ("format", "fastchat_template", "system_prompt", "thinking", "chat_template_kwargs")


@dataclass(frozen=True)
class PromptFormat:
    """How a model is prompted: the `prompt:` block of a model config.

    kind: "chat" (the tokenizer's chat template), "fastchat" (a FastChat conversation template, for
    models without a chat template: Vicuna v1.1, Llama-2-chat) or "completion" (raw text continued by
    a base model). thinking: Qwen3's `enable_thinking` (None: the template's default).
    chat_template_kwargs: anything else for `apply_chat_template`.
    """

    kind: str
    fastchat_template: str | None = None
    system_prompt: str | None = None
    thinking: bool | None = None
    chat_template_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in PROMPT_KINDS:
            raise ValueError(f"model.prompt.format {self.kind!r} is unknown; use one of {', '.join(PROMPT_KINDS)}")
        if self.kind == "fastchat":
            _check_fastchat_template(self.fastchat_template)
        elif self.fastchat_template is not None:
            raise ValueError(f"model.prompt.fastchat_template is set but model.prompt.format is {self.kind!r}: "
                             "set format: fastchat, or fastchat_template: null")
        if self.kind != "chat" and (self.thinking is not None or self.chat_template_kwargs):
            # both only reach a tokenizer chat template; silently dropping them would hide a config mistake
            raise ValueError(f"model.prompt.thinking and chat_template_kwargs apply to format chat only, "
                             f"not {self.kind!r}; set them to null / {{}}")
        if self.kind == "completion" and self.system_prompt is not None:
            raise ValueError("model.prompt.system_prompt has no place in a completion prompt; set it to null")

    @classmethod
    def of(cls, prompt: PromptConfig) -> PromptFormat:
        """The format a validated run's `model.prompt` block describes (its keys checked by the schema)."""
        return cls(prompt.format.value, prompt.fastchat_template, prompt.system_prompt, prompt.thinking,
                   dict(prompt.chat_template_kwargs))


def _check_fastchat_template(name: str | None) -> None:
    from fastchat.conversation import conv_templates

    if name in conv_templates:
        return
    examples = [t for t in ("vicuna_v1.1", "llama-2", "chatglm3", "mistral", "zero_shot") if t in conv_templates]
    raise ValueError(
        f"model.prompt.fastchat_template {name!r} is not a FastChat template; use a name registered in "
        f"fastchat.conversation.conv_templates ({len(conv_templates)} are), e.g. {', '.join(examples)}"
    )


def _plain(value):
    """A DictConfig / ListConfig as plain Python containers (Hydra gives configs; templates want dicts)."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    except ImportError:
        pass
    return value


def prompt_format(model_cfg) -> PromptFormat:
    """The `PromptFormat` of a model config (DictConfig or dict) from its `prompt:` block.

    A config without the block is prompted with its chat template; unknown keys in the block are refused.
    """
    block = _plain(model_cfg.get("prompt")) or {}
    unknown = sorted(set(block) - set(PROMPT_KEYS))
    if unknown:
        raise ValueError(f"model.prompt has unknown keys {unknown}; known: {', '.join(PROMPT_KEYS)}")
    return PromptFormat(
        kind=block.get("format") or "chat",
        fastchat_template=block.get("fastchat_template"),
        system_prompt=block.get("system_prompt"),
        thinking=block.get("thinking"),
        chat_template_kwargs=dict(block.get("chat_template_kwargs") or {}),
    )


def encode(tokenizer, question: Question, answers: list[str], fmt: PromptFormat) -> list[int]:
    """Token ids asking turn `len(answers)` of `question`, after the earlier turns and the model's `answers`."""
    if not 0 <= len(answers) < len(question.turns):
        raise ValueError(f"question {question.question_id} has {len(question.turns)} turns; "
                         f"cannot ask turn {len(answers)}")
    if fmt.kind == "completion":
        return _encode_completion(tokenizer, question, answers)
    if fmt.kind == "fastchat":
        return _encode_fastchat(tokenizer, question, answers, fmt)
    return _encode_chat(tokenizer, question, answers, fmt)


def _encode_completion(tokenizer, question: Question, answers: list[str]) -> list[int]:
    # A base model continues text: the task's own prompt where the set has one (HumanEval's header and
    # docstring), earlier turns each followed by the model's answer and a newline, then the turn asked.
    asked = [question.meta.get("completion_prompt", question.turns[0]), *question.turns[1:]]
    text = "".join(q + a + "\n" for q, a in zip(asked, answers, strict=False)) + asked[len(answers)]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    return ([bos] if bos is not None else []) + ids


def _encode_fastchat(tokenizer, question: Question, answers: list[str], fmt: PromptFormat) -> list[int]:
    from fastchat.conversation import get_conv_template

    conv = get_conv_template(fmt.fastchat_template)
    if fmt.system_prompt is not None:
        conv.set_system_message(fmt.system_prompt)
    user, assistant = conv.roles[0], conv.roles[1]
    for q, a in zip(question.turns, answers, strict=False):
        conv.append_message(user, q)
        conv.append_message(assistant, a)
    conv.append_message(user, question.turns[len(answers)])
    conv.append_message(assistant, None)  # the open slot the model fills
    text = conv.get_prompt()
    # The reference tokenises FastChat prompts with the tokenizer's special tokens (Llama adds BOS);
    # a template that writes BOS itself must not get a second one.
    bos = tokenizer.bos_token
    return tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]


def _encode_chat(tokenizer, question: Question, answers: list[str], fmt: PromptFormat) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model is prompted with its chat template but the tokenizer has none: set "
                         "model.prompt.format to fastchat (with a fastchat_template) or completion")
    messages = [{"role": "system", "content": fmt.system_prompt}] if fmt.system_prompt else []
    for q, a in zip(question.turns, answers, strict=False):
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    messages.append({"role": "user", "content": question.turns[len(answers)]})
    kwargs = dict(fmt.chat_template_kwargs)
    if fmt.thinking is not None:
        kwargs["enable_thinking"] = fmt.thinking
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    # The template writes every special token itself (Llama-3's <|begin_of_text|>), as in the reference.
    return tokenizer(text, add_special_tokens=False)["input_ids"]
