"""The paper's models: their Hydra configs, the published EAGLE-3 draft layouts, and prompt formats.

Nothing is downloaded. Each `tests/fixtures/public_drafts/<model>.json` records a public draft's
`config.json` fields and checkpoint key names (sources and open questions in its "sources" and
"notes"); the test writes a checkpoint with exactly those keys and fields, shrunk to toy widths,
next to a tiny target of the same architecture and layer-count pattern, and loads it with the
strict `eagle.load_draft`.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch
import transformers
from helpers import hf_greedy, random_prompt, tiny_model
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from eagle import load_draft
from eval.benchmarks import load_questions
from eval.benchmarks.prompting import PromptFormat, encode, prompt_format
from eval.benchmarks.questions import Question
from eval.config.paths import REPO_ROOT
from eval.config.schema import LLAMA3_SYSTEM_PROMPT, PROMPTS, ModelConfig
from eval.runner.job_settings import fixed_tree
from mars import SpeculativeGenerator
from mars.decoding.settings import TreeShape

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG_DIR = REPO_ROOT / "configs"
FIXTURES = Path(__file__).parent / "fixtures" / "public_drafts"
PAPER_MODELS = {"vicuna13b", "llama31_8b", "llama33_70b", "qwen3_8b", "qwen3_32b", "qwen3_235b", "dsr1_llama8b"}
MODEL_CONFIGS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
DRAFTS = sorted(p.stem for p in FIXTURES.glob("*.json"))
TOP_KEYS = {"name", "target", "target_sha256", "draft", "sampling_draft", "tokenizer", "dtype", "device", "device_map",
            "max_memory", "headroom_gib", "allow_offload", "prompt", "exact_attention", "prepack", "plain_kernels",
            "static", "compile", "max_cache_len", "calibration_prompts"}


def compose_run(name: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=[f"model={name}"])


def compose_model(name: str):
    return compose_run(name).model


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


# --- model configs --------------------------------------------------------------------------------

def test_every_paper_model_has_a_config_and_a_draft_layout():
    assert PAPER_MODELS | {"embedded"} <= set(MODEL_CONFIGS)
    assert set(DRAFTS) == PAPER_MODELS


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_model_config_composes_with_every_field(name):
    cfg = compose_run(name)
    model = cfg.model
    assert set(model) == TOP_KEYS, f"{name}.yaml fields differ: {set(model) ^ TOP_KEYS}"
    assert model.name == name
    assert model.dtype.value in ("bfloat16", "float16", "float32", "auto")
    assert model.max_memory is None and model.allow_offload is False
    assert set(model.prompt) == {"format", "fastchat_template", "system_prompt", "thinking", "chat_template_kwargs"}
    fmt = prompt_format(model)  # validates the block (fastchat template names, kinds)
    assert isinstance(fmt, PromptFormat)
    # the model's tree preset is a valid tree (mars.decoding.settings.TreeShape checks every tree rule), resolved
    shape = fixed_tree(OmegaConf.to_object(cfg.tree), sampled=False)
    assert shape.drafting == "topk" and shape.label.startswith(f"{cfg.tree.total_tokens}/{cfg.tree.depth}/")
    assert model.exact_attention is None or isinstance(model.exact_attention, bool)  # None: auto
    # the model's own calibration prompts (tree.calibration_prompts=model, and =bench's fallback): questions to load
    assert load_questions(str(REPO_ROOT / model.calibration_prompts))


def test_embedded_config_keeps_its_cpu_settings():
    cfg = compose_run("embedded")
    model = cfg.model
    assert prompt_format(model) == PromptFormat(kind="completion")
    assert cfg.tree.calibrate is True  # the fastest tree on this machine (mars.tuning.search), cached
    # precision, exactness and kernels measured on the machine with the tree (mars.tuning.search)
    assert model.dtype.value == "auto" and model.exact_attention is None and model.device == "cpu"


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_paper_model_settings_follow_the_reference(name):
    cfg, layout = compose_run(name), fixture(name)
    model = cfg.model
    assert (model.target, model.draft) == (layout["target"], layout["draft"])
    # The MARS runs' tree, --total-token 50 --depth 6 --top-k 10, in this engine's terms (the reference
    # counts the root in total_token and drafts depth + 1 levels).
    assert (cfg.tree.total_tokens, cfg.tree.depth, cfg.tree.branching) == (49, 7, 10)
    assert model.device_map == "auto" and model.exact_attention is False
    fmt = prompt_format(model)
    if name == "vicuna13b":
        assert fmt == PromptFormat(kind="fastchat", fastchat_template="vicuna_v1.1")
        assert model.dtype.value == "float16"
    else:
        assert fmt.kind == "chat" and fmt.system_prompt.startswith("You are a helpful, respectful and honest")
        assert "being safe.  Your answers" in fmt.system_prompt  # verbatim, double space included
        qwen = name.startswith("qwen3")
        assert fmt.thinking is (False if qwen else None)
        assert model.dtype.value == ("bfloat16" if qwen else "float16")


def test_chat_models_share_one_system_prompt():
    """The paper's chat models (the LLaMA-3 scripts' message, which the MARS scripts of DeepSeek-R1-Distill
    and Qwen3 send too) compose to the one constant, and its text is written in no config file."""
    prompts = {name: prompt_format(compose_model(name)).system_prompt for name in PAPER_MODELS - {"vicuna13b"}}
    assert prompts == dict.fromkeys(prompts, LLAMA3_SYSTEM_PROMPT), "a chat config's system prompt differs"
    copies = [p.name for p in CONFIG_DIR.rglob("*.yaml") if "helpful, respectful and honest" in p.read_text()]
    assert copies == [], f"the LLaMA-3 system prompt is restated in {copies}: take the prompt preset instead"


def _leaves(block: dict, prefix: str = "") -> dict:
    """{dotted key: value} of a nested dict's leaves (an empty dict is a leaf)."""
    out = {}
    for key, value in block.items():
        if isinstance(value, dict) and value:
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("name", MODEL_CONFIGS)
def test_model_yaml_states_only_what_differs_from_the_schema(name):
    """A model YAML restates no default: neither the schema's (`ModelConfig`) nor its prompt preset's
    (`PROMPTS`, taken in its defaults list), so that each file shows what is particular to its model."""
    path = CONFIG_DIR / "model" / f"{name}.yaml"
    written = OmegaConf.to_container(OmegaConf.load(path))
    presets = [entry for entry in written.pop("defaults", []) if isinstance(entry, dict)]
    if path.read_text().startswith("# @package _global_"):  # its model block, beside other groups' settings
        written = written["model"]
        assert written and written["name"] == name
    base = OmegaConf.structured(ModelConfig)
    for entry in presets:
        for group, option in entry.items():
            if group.startswith("/prompt@"):
                base.prompt = OmegaConf.merge(base.prompt, OmegaConf.structured(PROMPTS[option]))
    defaults = _leaves(OmegaConf.to_container(base, enum_to_str=True))
    restated = sorted(key for key, value in _leaves(written).items() if key in defaults and defaults[key] == value)
    assert restated == [], f"{name}.yaml restates defaults: {restated}"


# --- public draft layouts -------------------------------------------------------------------------

TOY_HIDDEN, TOY_VOCAB, TOY_DRAFT_VOCAB = 64, 256, 128
TINY_ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe"}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def toy_layers(real_layers: int) -> int:
    """Few layers (>= 4 so the three EAGLE-3 taps are distinct), still growing with the real depth."""
    return max(4, real_layers // 8)


def default_taps(layers: int) -> list[int]:
    """EAGLE-3's taps as hidden-state indices: the states entering layers 2, L // 2 and L - 3."""
    return [2, layers // 2, layers - 3]


def toy_config(published: dict, layers: int) -> dict:
    """The published config with every field kept, widths shrunk consistently.

    Kept: the GQA group size (heads / KV heads) and heads x head_dim / hidden_size (2 for a draft
    whose attention is wider than its hidden size), the MLP's width ratio, whether the draft vocabulary
    is reduced. EAGLE/SpecForge aux-layer ids are rewritten for the toy target's depth.
    """
    hidden, heads = published["hidden_size"], published["num_attention_heads"]
    group = heads // published.get("num_key_value_heads", heads)
    width = heads * published.get("head_dim", hidden // heads) / hidden
    toy_heads = max(4, group)
    toy = dict(published)
    toy.update(
        hidden_size=TOY_HIDDEN,
        num_attention_heads=toy_heads,
        num_key_value_heads=toy_heads // group,
        intermediate_size=round(published["intermediate_size"] * TOY_HIDDEN / hidden),
        vocab_size=TOY_VOCAB,
        draft_vocab_size=TOY_DRAFT_VOCAB if published["draft_vocab_size"] < published["vocab_size"] else TOY_VOCAB,
    )
    if "head_dim" in published:
        toy["head_dim"] = int(width * TOY_HIDDEN / toy_heads)
    if "target_hidden_size" in published:
        toy["target_hidden_size"] = round(published["target_hidden_size"] * TOY_HIDDEN / hidden)
    if "eagle_config" in published:  # decoder-layer outputs 1, L // 2 - 1, L - 4 = hidden states 2, L // 2, L - 3
        toy["eagle_config"] = {**published["eagle_config"],
                               "eagle_aux_hidden_state_layer_ids": [t - 1 for t in default_taps(layers)]}
    return toy


def key_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """The shape of every key an EAGLE-3 checkpoint may hold, for config `c`."""
    hidden, inter, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    kv, head_dim = c.get("num_key_value_heads", heads), c.get("head_dim") or hidden // heads
    features = 3 * c.get("target_hidden_size", hidden)
    return {
        "midlayer.self_attn.q_proj.weight": (heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "fc.weight": (hidden, features),
        "norm.weight": (hidden,),
        "lm_head.weight": (c["draft_vocab_size"], hidden),
        "embed_tokens.weight": (c["vocab_size"], hidden),
        "d2t": (c["draft_vocab_size"],),
        "t2d": (c["vocab_size"],),
    }


def toy_state(c: dict, keys: list[str], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under exactly `keys`, in the checkpoint's dtype; a valid draft -> target id map."""
    g = torch.Generator().manual_seed(seed)
    shapes, dtype = key_shapes(c), DTYPES[c.get("torch_dtype", "float32")]
    vocab, draft_vocab = c["vocab_size"], c["draft_vocab_size"]
    ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values if draft_vocab < vocab else torch.arange(vocab)
    state = {}
    for key in keys:
        if key == "d2t":
            state[key] = ids - torch.arange(draft_vocab)
        elif key == "t2d":
            state[key] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)
        elif key.endswith("norm.weight"):
            state[key] = torch.ones(shapes[key], dtype=dtype)
        else:
            state[key] = (torch.randn(shapes[key], generator=g) * 0.05).to(dtype)
    return state


def write_checkpoint(directory: Path, config: dict, state: dict, weights_file: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if weights_file == "pytorch_model.bin":
        torch.save(state, directory / weights_file)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(directory / weights_file))
    return directory


def toy_pair(name: str, tmp_path: Path, keys: list[str] | None = None):
    """(tiny target, checkpoint directory, toy config) for the public draft `name`."""
    layout = fixture(name)
    real = layout["target_config"]
    layers = toy_layers(real["num_hidden_layers"])
    config = toy_config(layout["config"], layers)
    target = tiny_model(TINY_ARCH[real["model_type"]], vocab_size=TOY_VOCAB, num_hidden_layers=layers,
                        hidden_size=config.get("target_hidden_size", TOY_HIDDEN))
    directory = write_checkpoint(tmp_path / name, config, toy_state(config, keys or layout["keys"]),
                                 layout["weights_file"])
    return target, directory, config


@pytest.mark.parametrize("name", DRAFTS)
def test_fixture_records_a_consistent_published_layout(name):
    layout = fixture(name)
    config, real = layout["config"], layout["target_config"]
    assert layout["model"] == name and layout["weights_file"] in ("pytorch_model.bin", "model.safetensors")
    assert layout["sources"] and isinstance(layout["notes"], list)
    assert config["vocab_size"] == real["vocab_size"]
    assert config.get("target_hidden_size", config["hidden_size"]) == real["hidden_size"]
    assert set(layout["keys"]) <= set(key_shapes(config)), "a key outside the EAGLE-3 layout"
    if config["draft_vocab_size"] < config["vocab_size"]:
        assert "d2t" in layout["keys"], "a reduced draft vocabulary needs its d2t map"
    published_taps = config.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
    if published_taps is not None:  # load_draft derives the default taps; they must be the published ones
        assert [t + 1 for t in published_taps] == default_taps(real["num_hidden_layers"])


@pytest.mark.parametrize("name", DRAFTS)
def test_public_draft_layout_loads_strictly(name, tmp_path):
    target, directory, config = toy_pair(name, tmp_path)
    head = load_draft(directory, target)
    layers = target.config.num_hidden_layers
    assert head.config.kind == "eagle3"
    assert head.config.feature_layers == default_taps(layers)
    assert head.config.draft_vocab_size == config["draft_vocab_size"]
    assert head.config.head_dim == config.get("head_dim", TOY_HIDDEN // config["num_attention_heads"])
    assert head.config.rope_theta == config.get("rope_theta", 10000.0)  # absent: the reference's 10000
    state = toy_state(config, fixture(name)["keys"])
    loaded = head.state_dict()
    for key, value in state.items():  # every published tensor arrived (in the target's dtype)
        assert torch.equal(loaded[key].to(value.dtype), value), key
    # and the pair runs: strict greedy speculative decoding reproduces the target's greedy output
    prompt = random_prompt(random.Random(0), TOY_VOCAB, 6)
    with SpeculativeGenerator(target, head, TreeShape(8, 3, 2)) as gen:
        out = gen.generate(prompt, max_new_tokens=6)
    assert out.tokens == hf_greedy(target, prompt, 6)


@pytest.mark.parametrize("name", ["llama31_8b", "qwen3_235b"])
def test_a_missing_or_stray_key_is_refused_by_name(name, tmp_path):
    keys = fixture(name)["keys"]
    target, directory, _ = toy_pair(name, tmp_path / "missing", [k for k in keys if k != "midlayer.mlp.up_proj.weight"])
    with pytest.raises(ValueError, match=r"missing keys \['midlayer\.mlp\.up_proj\.weight'\]"):
        load_draft(directory, target)
    stray = "midlayer.self_attn.rotary_emb.inv_freq"  # what an older export can carry
    target, directory, config = toy_pair(name, tmp_path / "stray")
    state = toy_state(config, keys)
    state[stray] = torch.ones(4)
    write_checkpoint(directory, config, state, fixture(name)["weights_file"])
    with pytest.raises(ValueError, match=rf"unexpected keys \['{stray}'\]"):
        load_draft(directory, target)


def test_a_reduced_draft_vocabulary_without_its_map_is_refused(tmp_path):
    keys = [k for k in fixture("llama31_8b")["keys"] if k not in ("d2t", "t2d")]
    target, directory, _ = toy_pair("llama31_8b", tmp_path, keys)
    with pytest.raises(ValueError, match="d2t"):
        load_draft(directory, target)


def test_a_model_optimizer_export_without_t2d_loads(tmp_path):
    """Model Optimizer exports (nvidia/*-Eagle3) ship d2t alone; t2d follows from it."""
    keys = [k for k in fixture("qwen3_235b")["keys"] if k != "t2d"]
    target, directory, _ = toy_pair("qwen3_235b", tmp_path, keys)
    head = load_draft(directory, target)
    expected = torch.zeros(head.config.vocab_size, dtype=torch.bool)
    expected[torch.arange(head.config.draft_vocab_size) + head.d2t] = True
    assert torch.equal(head.t2d, expected) and int(head.t2d.sum()) == head.config.draft_vocab_size


# --- prompt formats -------------------------------------------------------------------------------

def llama_like_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer that, like Llama's, adds <s> when asked for special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    text = ("A chat between a curious user and an artificial intelligence assistant. USER: ASSISTANT: "
            "def add(a, b):\n    return a + b\n") * 4
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")


def fastchat_prompt(turns: list[str], answers: list[str], system: str | None = None) -> str:
    from fastchat.conversation import get_conv_template

    conv = get_conv_template("vicuna_v1.1")
    if system is not None:
        conv.set_system_message(system)
    for q, a in zip(turns, [*answers, None], strict=True):
        conv.append_message(conv.roles[0], q)
        conv.append_message(conv.roles[1], a)
    return conv.get_prompt()


def test_fastchat_vicuna_prompts_match_fastchat_single_and_multi_turn():
    tok, fmt = llama_like_tokenizer(), PromptFormat(kind="fastchat", fastchat_template="vicuna_v1.1")
    q = Question(81, ["Compose a travel blog post.", "Rewrite it starting every sentence with A."])
    for answers in ([], ["Aloha from Hawaii."]):
        ids = encode(tok, q, answers, fmt)
        text = fastchat_prompt(q.turns[: len(answers) + 1], answers)
        # the reference: tokenizer([conv.get_prompt()]).input_ids, i.e. with the tokenizer's BOS
        assert ids == tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
        assert text.endswith("ASSISTANT:") and text.startswith("A chat between a curious user")
    assert "USER: Compose a travel blog post. ASSISTANT: Aloha from Hawaii.</s>USER: Rewrite" in text
    brief = PromptFormat(kind="fastchat", fastchat_template="vicuna_v1.1", system_prompt="Be brief.")
    custom = encode(tok, q, [], brief)
    assert custom == tok(fastchat_prompt(q.turns[:1], [], "Be brief."))["input_ids"]


def test_fastchat_prompt_that_starts_with_bos_gets_no_second_one():
    tok = llama_like_tokenizer()
    fmt = PromptFormat(kind="fastchat", fastchat_template="vicuna_v1.1", system_prompt="<s>Be brief.")
    ids = encode(tok, Question(0, ["hi"]), [], fmt)
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    "{% if enable_thinking is defined %}[think={{ enable_thinking }}]{% endif %}"
    "{% if style is defined %}[style={{ style }}]{% endif %}"
)


def chat_tokenizer() -> transformers.PreTrainedTokenizerFast:
    tok = llama_like_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def test_chat_template_multi_turn_with_system_prompt():
    tok = chat_tokenizer()
    q = Question(1, ["q1", "q2"])
    ids = encode(tok, q, ["a1"], PromptFormat(kind="chat", system_prompt="S"))
    assert tok.decode(ids) == "<|system|>S\n<|user|>q1\n<|assistant|>a1\n<|user|>q2\n<|assistant|>"
    assert tok.bos_token_id not in ids  # the template owns special tokens; none are added
    first = encode(tok, q, [], PromptFormat(kind="chat"))
    assert tok.decode(first) == "<|user|>q1\n<|assistant|>"


def test_qwen3_thinking_switch_and_template_kwargs_reach_the_template():
    tok, q = chat_tokenizer(), Question(2, ["q"])
    off = tok.decode(encode(tok, q, [], PromptFormat(kind="chat", thinking=False)))
    on = tok.decode(encode(tok, q, [], PromptFormat(kind="chat", thinking=True)))
    default = tok.decode(encode(tok, q, [], PromptFormat(kind="chat")))
    assert off.endswith("[think=False]") and on.endswith("[think=True]") and "[think=" not in default
    styled = tok.decode(encode(tok, q, [], PromptFormat(kind="chat", chat_template_kwargs={"style": "terse"})))
    assert styled.endswith("[style=terse]")


def test_chat_format_without_a_template_names_the_fix():
    with pytest.raises(ValueError, match="model.prompt.format to fastchat"):
        encode(llama_like_tokenizer(), Question(0, ["hi"]), [], PromptFormat(kind="chat"))


def test_asking_past_the_last_turn_is_refused():
    with pytest.raises(ValueError, match="2 turns"):
        encode(chat_tokenizer(), Question(0, ["a", "b"]), ["x", "y"], PromptFormat(kind="chat"))


def test_prompt_format_reads_the_config_block_and_refuses_mistakes():
    cfg = OmegaConf.create({"prompt": {"format": "chat", "fastchat_template": None, "system_prompt": "S",
                                       "thinking": False, "chat_template_kwargs": {"style": "terse"}}})
    fmt = prompt_format(cfg)
    assert fmt == PromptFormat(kind="chat", system_prompt="S", thinking=False, chat_template_kwargs={"style": "terse"})
    assert type(fmt.chat_template_kwargs) is dict  # plain, as apply_chat_template expects
    assert prompt_format({}) == PromptFormat(kind="chat")
    with pytest.raises(ValueError, match="unknown keys \\['fastchat_templte'\\]"):
        prompt_format({"prompt": {"format": "fastchat", "fastchat_templte": "vicuna_v1.1"}})
    with pytest.raises(ValueError, match="vicuna_v1.1, llama-2"):
        prompt_format({"prompt": {"format": "fastchat", "fastchat_template": "vicuna"}})
    with pytest.raises(ValueError, match="set format: fastchat"):
        PromptFormat(kind="chat", fastchat_template="vicuna_v1.1")
    with pytest.raises(ValueError, match="format chat only"):
        PromptFormat(kind="completion", thinking=False)
    with pytest.raises(ValueError, match="chat, fastchat, completion"):
        PromptFormat(kind="raw")


# --- question files -------------------------------------------------------------------------------

HUMANEVAL_TASKS = [
    {"task_id": "HumanEval/0", "prompt": 'def add(a, b):\n    """Return a + b."""\n', "entry_point": "add"},
    {"task_id": "HumanEval/1", "prompt": 'def neg(x):\n    """Return -x."""\n', "entry_point": "neg"},
]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def humaneval_dir(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "humaneval.jsonl", [
        {"question_id": 0, "category": "coding", "turns": ["Write add(a, b) returning a + b."],
         "reference": ["    return a + b"]},
        {"question_id": 1, "category": "coding", "turns": ["Write neg(x)."], "reference": ["    return -x"]},
    ])
    with gzip.open(tmp_path / "HumanEval.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(t) + "\n" for t in HUMANEVAL_TASKS)
    return tmp_path


def test_humaneval_in_completion_form_gets_the_task_prompt_after_bos(tmp_path):
    questions = load_questions("humaneval", data_dir=humaneval_dir(tmp_path))
    assert [q.meta["completion_prompt"] for q in questions] == [t["prompt"] for t in HUMANEVAL_TASKS]
    tok = llama_like_tokenizer()
    ids = encode(tok, questions[0], [], PromptFormat(kind="completion"))
    assert ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == HUMANEVAL_TASKS[0]["prompt"]
    assert tok.decode(ids[1:]).startswith("def add(a, b):") and ids.count(tok.bos_token_id) == 1
    # a chat model is asked the set's own turn
    chat = chat_tokenizer()
    assert "Write add(a, b)" in chat.decode(encode(chat, questions[0], [], PromptFormat(kind="chat")))
    # the same file by path gets the task prompts too
    by_path = load_questions(str(tmp_path / "humaneval.jsonl"))
    assert by_path[1].meta["completion_prompt"] == HUMANEVAL_TASKS[1]["prompt"]


def test_completion_multi_turn_concatenates_turns_and_answers():
    tok = llama_like_tokenizer()
    ids = encode(tok, Question(3, ["first ", "second "]), ["answer"], PromptFormat(kind="completion"))
    assert ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == "first answer\nsecond "


def test_questions_keep_references_and_other_fields(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", [
        {"question_id": 1, "category": "math", "turns": ["2+2?"], "reference": ["4"], "source": "gsm8k"},
        {"question_id": 2, "turns": ["hi"]},
        {"question_id": "x", "prompt": "def f():\n", "reference": "pass", "file": "a.py"},
    ])
    a, b, c = load_questions(str(path))
    assert (a.reference, a.category, a.meta) == (["4"], "math", {"source": "gsm8k"})
    assert b.reference is None and b.meta == {}
    assert (c.turns, c.reference, c.meta) == (["def f():\n"], ["pass"], {"file": "a.py"})
    assert [q.question_id for q in load_questions(str(path), limit=2)] == [1, 2]


def test_a_malformed_line_names_file_line_and_fix(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question_id": 1, "turns": ["ok"]}\n\n{"question_id": 2, "turns": ["no end"\n')
    with pytest.raises(ValueError, match=rf"{path}:3: malformed JSON .*fix or delete that line"):
        load_questions(str(path))
    path.write_text('{"question_id": 1, "turns": ["ok"]}\n["not", "an", "object"]\n')
    with pytest.raises(ValueError, match=rf"{path}:2: a question is a JSON object"):
        load_questions(str(path))
