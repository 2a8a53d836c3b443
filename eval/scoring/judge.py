"""Optional LLM-as-a-judge grading for the open-ended sets (MT-bench, Alpaca, Natural Questions).

Single-answer grading as in MT-bench (Zheng et al., 2023): a judge model reads the question and the
answer, writes an explanation and ends with a rating "[[r]]", r in 1..10. The prompts are the
FastChat judge prompts shipped with the benchmark files (`judge_prompts.jsonl` in the bench
directory); which one is used for a turn:

    turn 1: `single-v1`, or `single-math-v1` (with the reference answer) when the question's
            category needs a reference (math, reasoning, coding) and the question file has one;
    turn 2: `single-v1-multi-turn` / `single-math-v1-multi-turn`, which show the whole conversation
            and ask about the second answer (MT-bench only; the other sets have one turn).

The judge is any OpenAI-compatible chat-completions endpoint, called over HTTP with the standard
library (no client dependency), temperature 0. It is configured only when both an endpoint URL and an
API key are given (arguments, else $MARS_JUDGE_URL / $MARS_JUDGE_KEY; model from $MARS_JUDGE_MODEL,
default `gpt-4`, MT-bench's judge); otherwise nothing is judged and nothing is contacted.

`judge_score` = mean rating over every judged turn (MT-bench: both turns of every question);
replies without a readable rating are counted in `judge_failed` and left out of the mean.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from eval.rundirs.jsonl import read_jsonl

ENV_URL, ENV_KEY, ENV_MODEL = "MARS_JUDGE_URL", "MARS_JUDGE_KEY", "MARS_JUDGE_MODEL"
DEFAULT_MODEL = "gpt-4"
PROMPTS_FILE = "judge_prompts.jsonl"
REFERENCE_CATEGORIES = ("math", "reasoning", "coding")  # MT-bench grades these against a reference answer
# Statuses worth retrying: rate limits and transient server trouble. Anything else (401, 404, 400) is
# a configuration error that retrying cannot fix.
RETRY_STATUSES = (408, 409, 429, 500, 502, 503, 504)

# The verdict is the last "[[r]]" of the reply (judges sometimes quote the format example "[[5]]"
# earlier); a single-bracket "[r]" is accepted when no double-bracket one exists.
_RATING = re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]")
_RATING_LOOSE = re.compile(r"\[\s*(\d+(?:\.\d+)?)\s*\]")


class JudgeError(RuntimeError):
    """The judge endpoint could not be used (unreachable, refused the request, or gave no ratings)."""


@dataclass(frozen=True)
class JudgeConfig:
    url: str
    key: str
    model: str = DEFAULT_MODEL
    timeout: float = 120.0  # seconds per request
    retries: int = 3  # extra attempts after a transient failure
    backoff: float = 2.0  # seconds before the first retry, doubled each time
    workers: int = 4  # requests in flight at once
    max_tokens: int = 2048

    @property
    def endpoint(self) -> str:
        """`url` if it already names the chat-completions route, else `url` + /chat/completions."""
        url = self.url.rstrip("/")
        return url if url.endswith("/chat/completions") else url + "/chat/completions"

    def __repr__(self) -> str:  # never show the key in logs or tracebacks
        return f"JudgeConfig(url={self.url!r}, model={self.model!r})"


def judge_config(url: str | None = None, key: str | None = None, model: str | None = None,
                 **options) -> JudgeConfig | None:
    """The judge to use: explicit values, else the environment; None unless both a URL and a key are known."""
    url = url or os.environ.get(ENV_URL)
    key = key or os.environ.get(ENV_KEY)
    if not url or not key:
        return None
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"judge URL {url!r} is not an http(s) URL; give the endpoint's base URL, e.g. "
                         "https://api.openai.com/v1")
    return JudgeConfig(url, key, model or os.environ.get(ENV_MODEL) or DEFAULT_MODEL, **options)


def load_judge_prompts(directory: str | Path) -> dict[str, dict]:
    """The judge prompts of `directory`/judge_prompts.jsonl by name."""
    path = Path(directory) / PROMPTS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {PROMPTS_FILE} in {path.parent}: the LLM judge needs FastChat's judge prompts "
                                "next to the benchmark files")
    return {record["name"]: record for record in read_jsonl(path).values()}


def parse_rating(reply: str) -> float | None:
    """The rating of a judge reply (see `_RATING`), or None when it has none in 1..10."""
    matches = _RATING.findall(reply) or _RATING_LOOSE.findall(reply)
    if not matches:
        return None
    rating = float(matches[-1])
    return rating if 1 <= rating <= 10 else None


def judge_messages(question: dict, answers: list[str], prompts: dict[str, dict]) -> list[tuple[str, str]]:
    """(system prompt, user prompt) for each turn of `answers` to `question` (a benchmark record)."""
    references = question.get("reference") or []
    math = question.get("category") in REFERENCE_CATEGORIES and len(references) >= len(answers)
    turns = question["turns"]
    messages = []
    for turn in range(len(answers)):
        if turn == 0:
            name = "single-math-v1" if math else "single-v1"
            fields = {"question": turns[0], "answer": answers[0]}
        elif turn == 1:
            name = "single-math-v1-multi-turn" if math else "single-v1-multi-turn"
            fields = {"question_1": turns[0], "answer_1": answers[0], "question_2": turns[1], "answer_2": answers[1]}
        else:
            raise ValueError(f"question {question['question_id']}: the judge prompts cover two turns, not {turn + 1}")
        if math:
            fields |= {f"ref_answer_{i + 1}": ref for i, ref in enumerate(references[:2])}
        if name not in prompts:
            raise ValueError(f"judge prompt {name!r} missing from {PROMPTS_FILE}")
        prompt = prompts[name]
        # str.format only parses the template; braces inside the question or answer are left alone.
        messages.append((prompt["system_prompt"], prompt["prompt_template"].format(**fields)))
    return messages


def chat(config: JudgeConfig, system: str, user: str) -> str:
    """The judge's reply to one conversation; retries transient failures, raises JudgeError otherwise."""
    body = json.dumps({
        "model": config.model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": config.max_tokens,
    }).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {config.key}"}
    for attempt in range(config.retries + 1):
        request = urllib.request.Request(config.endpoint, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=config.timeout) as response:
                payload = json.loads(response.read().decode())
            return payload["choices"][0]["message"]["content"] or ""
        except urllib.error.HTTPError as e:
            if e.code not in RETRY_STATUSES or attempt == config.retries:
                detail = e.read().decode(errors="replace")[:200]
                raise JudgeError(f"judge endpoint {config.endpoint} answered HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            if attempt == config.retries:
                raise JudgeError(f"judge endpoint {config.endpoint} unreachable: {e}") from None
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError(f"judge endpoint {config.endpoint} did not answer with a chat completion") from None
        time.sleep(config.backoff * 2**attempt)
    raise AssertionError("unreachable")


def judge_answers(questions: dict[str, dict], answers: dict[str, list[str]], config: JudgeConfig,
                  prompts: dict[str, dict]) -> dict[str, list[float | None]]:
    """Ratings per question (one per answered turn; None where the reply had no rating).

    `questions` and `answers` are keyed alike (question id as a string); every answer's question
    must be in `questions`.
    """
    jobs = [(qid, system, user) for qid, turns in answers.items()
            for system, user in judge_messages(questions[qid], turns, prompts)]
    with ThreadPoolExecutor(max_workers=max(1, config.workers)) as pool:
        replies = list(pool.map(lambda job: chat(config, job[1], job[2]), jobs))
    ratings: dict[str, list[float | None]] = {qid: [] for qid in answers}
    for (qid, _, _), reply in zip(jobs, replies, strict=True):
        ratings[qid].append(parse_rating(reply))
    if jobs and all(r is None for turns in ratings.values() for r in turns):
        raise JudgeError(f"the judge ({config.model} at {config.endpoint}) gave no [[rating]] in any of {len(jobs)} "
                         f"replies; first reply: {replies[0][:200]!r}")
    return ratings
