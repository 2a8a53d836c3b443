"""Benchmark quality scoring (eval.score), the LLM judge (eval.scoring.judge) and the `python -m eval.score` CLI.

The benchmark files come from `eval.config.paths.bench_dir()` ($MARS_BENCH_DIR in CI). The judge is only
ever pointed at a fake chat-completions server that this module starts on 127.0.0.1.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from eval.benchmarks import score_files as S
from eval.config.paths import REPO_ROOT, bench_dir
from eval.reporting.metrics import ratio
from eval.score import main as cli_main
from eval.scoring import text as M
from eval.scoring.judge import JudgeError, judge_config, parse_rating

DATA = bench_dir()
PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
JUDGE_VARS = ("MARS_JUDGE_URL", "MARS_JUDGE_KEY", "MARS_JUDGE_MODEL")


def record(qid, *turns: str) -> dict:
    return {"question_id": qid, "answer_id": f"a{qid}", "model_id": "m", "tstamp": 0.0,
            "choices": [{"index": 0, "turns": list(turns)}]}


def questions(bench: str) -> list[dict]:
    return list(S.questions_by_id(bench, DATA).values())


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(autouse=True)
def no_judge_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test judges unless it says so, and loopback requests never go through a proxy."""
    for var in JUDGE_VARS + PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


# --- final numbers --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("#### 18", "18"),
    ("She makes 9 * 2 = $18 every day.\n#### 18\nLater: 20 more eggs, 3 hens.", "18"),  # "####" beats later numbers
    ("#### $1,800.", "1800"),
    ("The total is 1,000 apples.", "1000"),
    ("It costs $1,234,567.50 in all", "1234567.50"),
    (r"so the answer is \boxed{ 42 }.", "42"),
    (r"\boxed{\$18.00}", "18.00"),
    (r"first \boxed{3}, corrected: \boxed{5}", "5"),  # the last box
    (r"\boxed{x = 7}", "7"),
    (r"\boxed{336^\circ}", "336"),
    (r"\boxed{1{,}000}", "1000"),
    (r"\boxed{\text{18 dollars}}", "18"),
    (r"\boxed{\frac{3}{4}}", "3/4"),
    (r"\boxed{-\dfrac{1}{2}}", "-1/2"),
    (r"\boxed{\sqrt{\frac{1}{4}}}", "1/4"),  # nested braces are balanced, not cut at the first "}"
    ("The temperature fell to -5 degrees.", "-5"),
    ("the answer is \u22127", "-7"),  # Unicode minus
    ("pages 3-5", "5"),  # a range, not minus five
    ("about 0.5 of it, i.e. 50%", "50"),
    ("The answer is 12.", "12"),
    ("no digits at all", None),
    ("", None),
])
def test_extract_final_number(text: str, expected: str | None) -> None:
    assert M.extract_final_number(text) == expected


def test_numbers_equal() -> None:
    assert M.numbers_equal("18", "18.0") and M.numbers_equal("18", "18.00") and M.numbers_equal("1,800", "1800")
    assert M.numbers_equal("$18", "18") and M.numbers_equal("3/4", "0.75") and M.numbers_equal("-5", "-5.0")
    assert not M.numbers_equal("18", "19") and not M.numbers_equal("18", "-18") and not M.numbers_equal("18", None)
    assert M.numbers_equal(r"\pi", r" \pi ") and not M.numbers_equal(r"\pi", "3")


# --- GSM8K and AIME -------------------------------------------------------------------------------

def test_gsm8k_references_are_correct_answers() -> None:
    qs = questions("gsm8k")
    refs = [q["reference"] for q in qs]
    texts = ["\n".join(r) for r in refs]
    assert M.gsm8k_accuracy(texts, refs) == 1.0
    result = S.score("gsm8k", [record(q["question_id"], t) for q, t in zip(qs, texts, strict=True)], DATA)
    assert result == {"bench": "gsm8k", "n": len(qs), "accuracy": 1.0, "metric": "accuracy"}
    wrong = [f"#### {int(M.gsm8k_reference_answer(r)) + 1}" for r in refs]
    assert M.gsm8k_accuracy(wrong, refs) == 0.0
    result = S.score("gsm8k", [record(q["question_id"], t) for q, t in zip(qs, wrong, strict=True)], DATA,
                     per_question=True)
    assert result["accuracy"] == 0.0
    first = result["per_question"][str(qs[0]["question_id"])]
    assert first == {"correct": False, "answer": "19", "reference": "18"}  # Janet's ducks: $18


def test_aime_references_are_correct_answers() -> None:
    qs = questions("aime2025")
    refs = [q["reference"] for q in qs]
    texts = [f"The answer is \\boxed{{{r[0]}}}." for r in refs]
    assert M.aime_accuracy(texts, refs) == 1.0
    assert S.score("aime2025", [record(q["question_id"], t) for q, t in zip(qs, texts, strict=True)],
                   DATA)["accuracy"] == 1.0
    wrong = [f"The answer is \\boxed{{{int(M.aime_reference_answer(r)) + 1}}}." for r in refs]
    assert M.aime_accuracy(wrong, refs) == 0.0
    half = texts[:15] + wrong[15:]
    assert M.aime_accuracy(half, refs) == 0.5


# --- BLEU, chrF, ROUGE ----------------------------------------------------------------------------

PAIRS = [
    ("The cat sat on the mat.", "The cat is sitting on the mat."),
    ("Civil rights group warns travellers about Missouri", "Civil rights group issues travel warning for Missouri"),
    ("Last week the drama was pulled off the air.", "Last week, the broadcast of the drama was temporarily halted."),
]


def test_wmt19_references_score_100() -> None:
    qs = questions("wmt19")
    result = S.score("wmt19", [record(q["question_id"], q["reference"][0]) for q in qs], DATA)
    assert result["n"] == len(qs) and result["metric"] == "bleu"
    assert result["bleu"] == pytest.approx(100) and result["chrf"] == pytest.approx(100)


def test_bleu_chrf_match_sacrebleu() -> None:
    hyps, refs = [h for h, _ in PAIRS], [r for _, r in PAIRS]
    got = M.bleu_chrf(hyps, refs)
    assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="13a").score)
    assert got["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert 0 < got["bleu"] < 100 and 0 < got["chrf"] < 100
    # By hand: every n-gram of "a b c d" is in the reference, so BLEU is the brevity penalty exp(1 - 8/4).
    assert M.bleu_chrf(["a b c d"], ["a b c d e f g h"])["bleu"] == pytest.approx(100 * math.exp(-1))
    with pytest.raises(ValueError, match="one reference per hypothesis"):
        M.bleu_chrf(hyps, refs[:2])


def test_rouge_matches_rouge_score() -> None:
    hyps, refs = [h for h, _ in PAIRS], [r for _, r in PAIRS]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    expected = {t: 100 * sum(scorer.score(r, h)[t].fmeasure for h, r in PAIRS) / len(PAIRS)
                for t in ("rouge1", "rouge2", "rougeL")}
    assert M.rouge(hyps, refs) == pytest.approx(expected)
    # By hand: "the cat sat" in "the cat sat on the mat": unigrams P = 1, R = 3/6; bigrams P = 1, R = 2/5; LCS 3.
    got = M.rouge(["the cat sat"], ["the cat sat on the mat"])
    assert got == pytest.approx({"rouge1": 200 / 3, "rouge2": 400 / 7, "rougeL": 200 / 3})


def test_sum_references_score_100() -> None:
    qs = questions("sum")
    result = S.score("sum", [record(q["question_id"], q["reference"][0]) for q in qs], DATA)
    assert result["metric"] == "rougeL" and result["n"] == len(qs)
    assert result["rouge1"] == result["rouge2"] == result["rougeL"] == pytest.approx(100)


# --- reference-free sets: agreement with vanilla ---------------------------------------------------

def test_vanilla_against_itself_and_a_changed_answer() -> None:
    qs = questions("mt_bench")
    vanilla = [record(q["question_id"], f"Answer one to {q['question_id']}, with detail.", "A second turn.")
               for q in qs]
    same = S.score("mt_bench", vanilla, DATA, baseline=vanilla)
    assert same == {"bench": "mt_bench", "n": len(qs), "rougeL_vs_vanilla": 100.0, "token_f1_vs_vanilla": 100.0,
                    "exact_match_vs_vanilla": 1.0, "metric": "rougeL_vs_vanilla"}
    changed = [dict(r) for r in vanilla]
    changed[0] = record(qs[0]["question_id"], "Something else entirely.", "A second turn.")
    result = S.score("mt_bench", changed, DATA, baseline=vanilla, per_question=True)
    turns = 2 * len(qs)  # pooled over both turns of every question
    assert result["exact_match_vs_vanilla"] == pytest.approx((turns - 1) / turns)
    assert result["rougeL_vs_vanilla"] < 100 and result["token_f1_vs_vanilla"] < 100
    first = result["per_question"][str(qs[0]["question_id"])]
    assert first["exact_match_vs_vanilla"] == 0.5 and first["rougeL_vs_vanilla"] < 100


def test_vanilla_metrics_by_hand() -> None:
    assert M.token_f1("The cat sat.", "a cat sat down") == pytest.approx(0.8)  # P = 1, R = 2/3 after normalising
    assert M.token_f1("", "") == 1.0 and M.token_f1("", "x") == 0.0
    ans, van = [["x  y\n", ""]], [["x y", ""]]  # whitespace differences and empty turns count as identical
    assert M.exact_match_vs_vanilla(ans, van) == 1.0 and M.rougeL_vs_vanilla(ans, van) == 100.0
    assert M.rougeL_vs_vanilla([["the cat sat"]], [["the cat sat on the mat"]]) == pytest.approx(200 / 3)
    assert M.token_f1_vs_vanilla([["a b"], ["c"]], [["a b"], ["d"]]) == pytest.approx(50.0)


def test_reference_free_needs_a_baseline() -> None:
    qa = [record(q["question_id"], "An answer.") for q in questions("qa")]
    with pytest.raises(ValueError, match="--baseline VANILLA.jsonl"):
        S.score("qa", qa, DATA)


def test_quality_recovery() -> None:
    assert ratio(0.9, 1.0) == pytest.approx(0.9)
    assert ratio(50.0, 40.0) == pytest.approx(1.25)
    assert ratio(0.5, 0) is None and ratio(0.5, None) is None
    assert ratio(None, 1.0) is None


# --- HumanEval: scored by eval.scoring.unit_tests ----------------------------------------------------------

def test_humaneval_is_delegated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wiring: score() hands the records to eval.scoring.unit_tests.score_humaneval and reports its pass@1."""
    calls = []

    def fake(records, data_dir=None, timeout=10.0, workers=2, tasks=None):
        calls.append((len(records), data_dir))
        return {"n": len(records), "pass@1": 0.5, "per_question": {"0": {"passed": True}, "1": {"passed": False}}}

    monkeypatch.setitem(sys.modules, "eval.scoring.unit_tests", types.SimpleNamespace(score_humaneval=fake))
    records = [record(0, "    return True\n"), record(1, "    return False\n")]
    assert S.score("humaneval", records, DATA) == {"bench": "humaneval", "n": 2, "pass@1": 0.5, "metric": "pass@1"}
    assert S.score("humaneval", records, DATA, per_question=True)["per_question"]["1"] == {"passed": False}
    assert calls == [(2, DATA), (2, DATA)]
    with pytest.raises(ValueError, match="another benchmark"):
        S.score("humaneval", [record(999, "x")], DATA)


def test_humaneval_runs_the_unit_tests() -> None:
    """The real thing on four tasks: canonical bodies (humaneval.jsonl's reference lines) pass, a stub fails."""
    qs = questions("humaneval")[:4]
    records = [record(q["question_id"], "\n".join(q["reference"]) + "\n") for q in qs]
    result = S.score("humaneval", records, DATA, per_question=True)
    assert result["n"] == 4 and result["pass@1"] == 1.0 and result["metric"] == "pass@1"
    records[3] = record(qs[3]["question_id"], "    return None\n")
    result = S.score("humaneval", records, DATA, per_question=True)
    assert result["pass@1"] == 0.75 and result["per_question"][str(qs[3]["question_id"])]["passed"] is False


# --- bad input ------------------------------------------------------------------------------------

def test_bad_input_messages(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown benchmark 'gsm9k'; registered: .*gsm8k"):
        S.score("gsm9k", [record(0, "1")], DATA)
    mt = [record(q["question_id"], "a", "b") for q in questions("mt_bench")]
    with pytest.raises(ValueError, match=r"not in gsm8k.jsonl \(question ids 121, .*another benchmark"):
        S.score("gsm8k", mt, DATA)
    with pytest.raises(ValueError, match="no answers"):
        S.score("gsm8k", [], DATA)
    with pytest.raises(ValueError, match="answers 1: answer to question 1 has no 'choices'"):
        S.score("gsm8k", [record(0, "1"), {"question_id": 1}], DATA)
    with pytest.raises(ValueError, match="has 1 turn"):
        S.score("mt_bench", [record(81, "only one")], DATA, baseline=[record(81, "a", "b")])
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        S.score("gsm8k", [record(0, "1")], tmp_path / "missing")


def test_read_answer_file(tmp_path: Path) -> None:
    good = [record(0, "#### 18"), record(1, "#### 3")]
    path = write_jsonl(tmp_path / "a.jsonl", good)
    assert S.read_answer_file(path) == good
    torn = tmp_path / "torn.jsonl"
    torn.write_text(path.read_text() + '{"question_id": 2, "choi')  # killed mid-write: no newline
    with pytest.warns(UserWarning, match="incomplete last line"):
        assert S.read_answer_file(torn) == good
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(good[0]) + "\n{oops\n" + json.dumps(good[1]) + "\n")
    with pytest.raises(ValueError, match=f"{bad}:2: malformed JSON"):
        S.read_answer_file(bad)
    no_turns = write_jsonl(tmp_path / "no_turns.jsonl", [good[0], {"question_id": 1, "choices": [{"index": 0}]}])
    with pytest.raises(ValueError, match=f"{no_turns}:2: answer to question 1 has no 'turns'"):
        S.read_answer_file(no_turns)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no answers"):
        S.read_answer_file(empty)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        S.read_answer_file(tmp_path / "nope.jsonl")


def test_load_references() -> None:
    refs = S.load_references("gsm8k", DATA)
    assert refs[0][-1] == "#### 18" and len(refs) == len(questions("gsm8k"))
    assert all(r == [] for r in S.load_references("qa", DATA).values())


# --- command line ---------------------------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m eval.score` in a process of its own (the end-to-end test; the others call `main`)."""
    env = {k: v for k, v in os.environ.items() if k not in JUDGE_VARS + PROXY_VARS}
    env |= {"MARS_BENCH_DIR": str(DATA), "no_proxy": "127.0.0.1,localhost", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "eval.score", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def call_cli(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    """`eval.score`'s main in this process (no interpreter start): exit code, stdout, stderr."""
    monkeypatch.setenv("MARS_BENCH_DIR", str(DATA))
    capsys.readouterr()
    code = cli_main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_gsm8k_end_to_end(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "answers.jsonl",
                       [record(q["question_id"], "\n".join(q["reference"])) for q in questions("gsm8k")])
    out = run_cli("gsm8k", str(path), "--per-question")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().split("\n")
    assert len(lines) > 1 and "accuracy" in lines[-2]  # readable lines first
    result = json.loads(lines[-1])
    assert result["accuracy"] == 1.0 and result["metric"] == "accuracy" and len(result["per_question"]) == result["n"]


@pytest.mark.parametrize("case, expected", [
    ("unknown_bench", "unknown benchmark 'gsm9k'; registered: gsm8k, aime2025"),
    ("missing_data_dir", "/nonexistent does not exist"),
    ("malformed_line", "answers.jsonl:2: malformed JSON"),
    ("unknown_ids", "the answer file is probably for another benchmark"),
    ("no_baseline", "--baseline VANILLA.jsonl"),
])
def test_cli_bad_input(tmp_path: Path, case: str, expected: str, capsys, monkeypatch) -> None:
    path = write_jsonl(tmp_path / "answers.jsonl", [record(0, "#### 18"), record(1, "#### 3")])
    args = ["gsm8k", str(path)]
    if case == "unknown_bench":
        args[0] = "gsm9k"
    elif case == "missing_data_dir":
        args += ["--data-dir", "/nonexistent"]
    elif case == "malformed_line":
        path.write_text(json.dumps(record(0, "#### 18")) + "\nnot json\n")
    elif case == "unknown_ids":
        write_jsonl(path, [record(q["question_id"], "a", "b") for q in questions("mt_bench")])
    elif case == "no_baseline":
        args[0] = "qa"
        write_jsonl(path, [record(q["question_id"], "a") for q in questions("qa")])
    code, stdout, stderr = call_cli(capsys, monkeypatch, *args)
    assert code == 2 and stdout == ""
    assert stderr.startswith("error: ") and stderr.count("\n") == 1 and "Traceback" not in stderr
    assert expected in stderr
    if case == "missing_data_dir":
        assert "--data-dir DIR" in stderr  # names the fix


# --- the LLM judge, against a fake server on the loopback interface -------------------------------

class FakeJudge(BaseHTTPRequestHandler):
    """Answers every chat completion with a canned verdict; `mode` selects failures."""

    requests: list[dict] = []
    mode = "rate"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers["Authorization"], "body": body})
        if self.mode == "unauthorized":
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error": "bad key"}')
            return
        text = "The answer is helpful. Rating: [[7]]" if self.mode == "rate" else "I cannot decide."
        payload = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:  # keep test output quiet
        pass


@pytest.fixture
def judge_server() -> Iterator[str]:
    FakeJudge.requests, FakeJudge.mode = [], "rate"
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    stop = threading.Timer(60, server.shutdown)  # stops by itself even if a test hangs
    stop.daemon = True
    stop.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        stop.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_parse_rating() -> None:
    assert parse_rating("Rating: [[7]]") == 7
    assert parse_rating('format "[[5]]" ... so Rating: [[8.5]]') == 8.5  # the last verdict
    assert parse_rating("Rating: [6]") == 6
    assert parse_rating("no verdict") is None and parse_rating("Rating: [[11]]") is None


def test_judge_config_needs_url_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert judge_config() is None and judge_config(url="http://127.0.0.1:9") is None
    monkeypatch.setenv("MARS_JUDGE_URL", "http://127.0.0.1:9/v1")
    assert judge_config() is None  # a URL alone configures nothing
    monkeypatch.setenv("MARS_JUDGE_KEY", "sk-test-secret")
    config = judge_config()
    assert config is not None and config.model == "gpt-4" and config.endpoint == "http://127.0.0.1:9/v1/chat/completions"
    assert config.key == "sk-test-secret" and "secret" not in repr(config)  # the key stays out of logs
    full = "http://127.0.0.1:9/v1/chat/completions"
    assert judge_config(url=full + "/", key="k").endpoint == full  # a full route is used as given
    with pytest.raises(ValueError, match="not an http"):
        judge_config(url="127.0.0.1:9", key="k")


def test_judge_mt_bench(judge_server: str) -> None:
    qs = questions("mt_bench")
    math_q = next(q for q in qs if q["category"] == "math" and q.get("reference"))
    chosen = [qs[0], math_q]
    records = [record(q["question_id"], "First answer {with braces}.", "Second answer.") for q in chosen]
    judge = {"url": judge_server, "key": "secret", "model": "judge-m", "backoff": 0}
    result = S.score("mt_bench", records, DATA, baseline=records, judge=judge, per_question=True)
    assert result["judge_score"] == 7.0 and result["metric"] == "judge_score" and result["judge_failed"] == 0
    assert result["rougeL_vs_vanilla"] == 100.0 and result["judge_model"] == "judge-m"
    assert result["per_question"][str(math_q["question_id"])]["judge"] == [7.0, 7.0]
    seen = FakeJudge.requests
    assert len(seen) == 4  # two questions, two turns each
    assert all(r["path"] == "/v1/chat/completions" and r["auth"] == "Bearer secret" for r in seen)
    assert all(r["body"]["model"] == "judge-m" and r["body"]["temperature"] == 0 for r in seen)
    prompts = [r["body"]["messages"][-1]["content"] for r in seen]
    assert sum("[The Start of Reference Answer]" in p for p in prompts) == 1  # the math question's first turn
    assert sum("### Reference answer:" in p for p in prompts) == 1  # and its second turn
    assert sum("### Assistant A:\nSecond answer." in p for p in prompts) == 2
    assert all("First answer {with braces}." in p for p in prompts)


def test_judge_from_environment_and_failures(judge_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    qa = [record(q["question_id"], "Someone.") for q in questions("qa")[:3]]
    assert "judge_score" not in S.score("qa", qa, DATA, baseline=qa)  # not configured: nothing judged
    assert FakeJudge.requests == []
    monkeypatch.setenv("MARS_JUDGE_URL", judge_server)
    monkeypatch.setenv("MARS_JUDGE_KEY", "k")
    result = S.score("qa", qa, DATA)  # a judge alone is enough for a reference-free set
    assert result["judge_score"] == 7.0 and result["metric"] == "judge_score" and len(FakeJudge.requests) == 3
    assert "rougeL_vs_vanilla" not in result
    FakeJudge.mode = "silent"
    with pytest.raises(JudgeError, match="gave no"):
        S.score("qa", qa, DATA, judge={"url": judge_server, "key": "k", "backoff": 0})
    FakeJudge.mode, FakeJudge.requests = "unauthorized", []
    with pytest.raises(JudgeError, match="HTTP 401"):
        S.score("qa", qa[:1], DATA, judge={"url": judge_server, "key": "k", "backoff": 0})
    assert len(FakeJudge.requests) == 1  # a refused request is not retried
    monkeypatch.delenv("MARS_JUDGE_KEY")
    with pytest.raises(ValueError, match="needs both an endpoint URL and an API key"):
        S.score("qa", qa, DATA, baseline=qa, judge={"url": judge_server})
    with pytest.raises(ValueError, match="scored against references"):
        S.score("gsm8k", [record(0, "#### 18")], DATA, judge={"url": judge_server, "key": "k"})


def test_cli_judge(judge_server: str, tmp_path: Path, capsys, monkeypatch) -> None:
    answers = [record(q["question_id"], "Do yoga.") for q in questions("qa")[:2]]  # a reference-free set
    path = write_jsonl(tmp_path / "qa.jsonl", answers)
    code, stdout, stderr = call_cli(capsys, monkeypatch, "qa", str(path), "--judge-url", judge_server,
                                    "--judge-key", "k", "--judge-model", "jm")
    assert code == 0, stderr
    result = json.loads(stdout.strip().split("\n")[-1])
    assert result["judge_score"] == 7.0 and result["metric"] == "judge_score" and result["n"] == 2
    assert [r["body"]["model"] for r in FakeJudge.requests] == ["jm", "jm"]
