"""The chat prompt set for training a chat model's draft head (eval/chat_prompts.py): deduplication,
the benchmark-overlap rule on the real benchmark files, and the docstring source's split."""

from __future__ import annotations

from eagle.train.corpus import split_of, stdlib_root
from eval.benchmarks import load_questions
from eval.chat_prompts import OVERLAP_WORDS, Overlap, benchmark_turns, build, deduplicated, docstring_prompts


def test_the_overlap_rule_on_hand_made_cases():
    overlap = Overlap(["What is the capital of France?",
                       "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural "
                       "experiences and must-see attractions."])
    assert overlap("what is the CAPITAL of france")  # equal up to case and punctuation
    assert overlap("Quick question: what is the capital of France? Answer in one word.")  # a short turn inside
    assert overlap("capital of France")  # a short prompt inside a turn
    assert not overlap("What is the capital of Spain?")
    eight = "a recent trip to Hawaii, highlighting cultural experiences"  # exactly OVERLAP_WORDS words shared
    assert len(eight.replace(",", "").split()) == OVERLAP_WORDS
    assert overlap(f"Tell me about {eight} please, in detail and with many jokes and asides")
    seven = "a recent trip to Hawaii, highlighting cultural"
    assert not overlap(f"Say more on {seven} and other things entirely different from it now")
    assert not overlap("")


def test_every_benchmark_question_is_caught_and_unrelated_prompts_pass():
    overlap = Overlap(benchmark_turns())
    for name in ("mt_bench", "gsm8k", "alpaca", "qa", "sum", "humaneval", "wmt19"):
        questions = load_questions(name)
        caught = [overlap(q.turns[0]) for q in questions]
        assert all(caught), (name, caught.count(False))
        # A question inside a longer prompt is caught too (the first 8+ words of a long one, or a short one whole).
        q = questions[len(questions) // 2].turns[0]
        assert overlap(f"Please help me with this. {q} Thanks a lot in advance for your help!"), name
    for prompt in ("How do I keep my sourdough starter alive while I travel for two weeks?",
                   "Explain what a Python decorator is, with a small example.", "Hi there!"):
        assert not overlap(prompt), prompt


def test_duplicates_go_in_order_and_counts_add_up():
    unique = deduplicated([("Hello  there!", "a"), ("hello there", "b"), ("Hello there, friend", "a")])
    assert unique == [("Hello there!", "a"), ("Hello there, friend", "a")]
    records, stats = build({"a": ["Hi!", "hi", "What is the capital of France?", "Tell me a joke."],
                            "b": ["Tell me a joke", "Name a color."]}, Overlap(["What is the capital of France?"]))
    assert [r["messages"][0]["content"] for r in records] == ["Hi!", "Tell me a joke.", "Name a color."]
    assert stats == {"a": {"offered": 4, "duplicates": 1, "overlap": 1, "kept": 2},
                     "b": {"offered": 2, "duplicates": 1, "overlap": 0, "kept": 1}}
    assert all(r["messages"][0]["role"] == "user" and r["source"] in "ab" for r in records)


def test_a_set_built_beside_another_shares_none_of_its_prompts():
    records, stats = build({"a": ["Tell me a joke!", "Name a colour.", "Why is the sky blue?"]}, Overlap([]),
                           exclude=["tell me a   JOKE", "Why is the sky green?"])
    assert [r["messages"][0]["content"] for r in records] == ["Name a colour.", "Why is the sky blue?"]
    assert stats == {"a": {"offered": 3, "duplicates": 1, "overlap": 0, "kept": 2}}


def test_docstring_prompts_ask_about_the_train_split_only():
    prompts = docstring_prompts(60, seed=1)
    assert len(prompts) == 60 and len(set(prompts)) > 55
    assert prompts == docstring_prompts(60, seed=1)  # deterministic
    root = stdlib_root()
    modules = {p.split("`")[3] if p.startswith("What does") else None for p in prompts} - {None}
    assert modules
    for module in modules:
        candidates = [root / (module.replace(".", "/") + ".py"), root / module.replace(".", "/") / "__init__.py"]
        path = next(c for c in candidates if c.exists())
        assert split_of(str(path.relative_to(root))) == "train", module
