"""A stand-in LLM judge: an OpenAI-compatible chat endpoint whose verdicts come from the task's hidden quality.

    .venv/bin/python -m examples.arena_vs_pointwise.judge_server --port 8011 --noise 1.5

The trainer reaches it through the real judge path (`rewards.llm_reward:llm_judge` for the pointwise
judge, `algorithm.arena.judge.type=llm` for the pairwise one, both `rewards.chat.ChatClient`), with
the example's templates (`pointwise_rubric.txt`, `pairwise_prompt.txt`): the server reads the question
and the answer(s) back out of the prompt, computes each answer's true quality q (`task.quality`) and
answers as a judge with discriminative collapse would:

- impression = band_low + (band_high - band_low) * q + noise * N(0, 1) + drift(call): the true quality
  squashed into a narrow band of the 0-10 scale, a fresh noise draw per answer per call, and a
  calibration that wanders with the call count, drift * sin(2 pi call / drift_period);
- pointwise (`<answer>` in the prompt): the impression rounded to `score_step` (1: the integer the
  rubric asks for) and clipped to 0-10, as `{"score": 7}`;
- pairwise (`<answer_a>` and `<answer_b>`): both impressions from the same noise model in one call
  (so one drift value), and `{"winner": "A"}` when A's is higher by more than `tie_margin`, "B" when
  lower, else "tie".

Neither judge sees more than the other: the same squashed quality, the same per-answer noise. What
differs is what the reply can carry: a pointwise score is rounded to the scale, and the drift of its
calls shifts scores of one group differently, while a pairwise verdict compares two impressions of one
call. Noise draws are seeded by (seed, prompt, how often that prompt was asked), so a run's verdicts do
not depend on the order concurrent requests arrive in. Every call is counted and logged (`calls`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import signal
import threading
from collections import Counter
from dataclasses import asdict, dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from examples.arena_vs_pointwise.task import quality

CONFIG = Path(__file__).with_name("config.yaml")
_TAG = {name: re.compile(rf"<{name}>(.*)</{name}>", re.S) for name in ("question", "answer", "answer_a", "answer_b")}


@dataclass
class StandInConfig:
    """The noise model (`judge:` in config.yaml); scores are on the rubric's 0-10 scale."""

    band_low: float = 6.0
    band_high: float = 8.0
    noise: float = 1.0
    drift: float = 0.5
    drift_period: int = 400
    score_step: float = 1.0
    tie_margin: float = 0.0
    seed: int = 0

    @classmethod
    def load(cls, path: str | Path = CONFIG, **overrides: Any) -> StandInConfig:
        """The `judge:` section of a config file, with `overrides` (None values ignored) on top."""
        raw = (yaml.safe_load(Path(path).read_text()) or {}).get("judge", {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: judge.{unknown[0]} is not a stand-in judge setting; valid: {sorted(known)}")
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**raw)


class StandInJudge:
    """The verdict logic, apart from HTTP: `reply(prompt) -> text`; thread-safe."""

    def __init__(self, cfg: StandInConfig):
        self.cfg = cfg
        self.lock = threading.Lock()
        self.count = 0
        self.seen: Counter[str] = Counter()
        self.calls: list[dict[str, Any]] = []

    def impression(self, q: float, rng: random.Random, drift: float) -> float:
        c = self.cfg
        return c.band_low + (c.band_high - c.band_low) * q + c.noise * rng.gauss(0.0, 1.0) + drift

    def reply(self, prompt: str) -> str:
        """The judge's reply to one rendered prompt (pointwise or pairwise, by its tags)."""
        question = _tag("question", prompt)
        pairwise = "<answer_a>" in prompt
        if question is None or (not pairwise and "<answer>" not in prompt):
            raise ValueError("prompt has neither <question> with <answer> nor <answer_a>/<answer_b>")
        digest = hashlib.sha256(prompt.encode()).hexdigest()
        with self.lock:
            index, self.count = self.count, self.count + 1
            self.seen[digest] += 1
            repeat = self.seen[digest]
        rng = random.Random(f"{self.cfg.seed}:{digest}:{repeat}")
        drift = self.cfg.drift * math.sin(2 * math.pi * index / max(1, self.cfg.drift_period))
        if pairwise:
            qa, qb = (quality(question, _tag(t, prompt) or "") for t in ("answer_a", "answer_b"))
            diff = self.impression(qa, rng, drift) - self.impression(qb, rng, drift)
            verdict = "A" if diff > self.cfg.tie_margin else "B" if diff < -self.cfg.tie_margin else "tie"
            record, text = {"kind": "pairwise", "q": [qa, qb], "verdict": verdict}, json.dumps({"winner": verdict})
        else:
            q = quality(question, _tag("answer", prompt) or "")
            score = min(10.0, max(0.0, self._round(self.impression(q, rng, drift))))
            record, text = {"kind": "pointwise", "q": q, "score": score}, _score_json(score)
        with self.lock:
            self.calls.append({"call": index, "question": question, **record})
        return text

    def _round(self, value: float) -> float:
        step = self.cfg.score_step
        return round(value / step) * step if step > 0 else value

    def stats(self) -> dict[str, int]:
        with self.lock:
            kinds = Counter(c["kind"] for c in self.calls)
        return {"calls": self.count, "pointwise": kinds["pointwise"], "pairwise": kinds["pairwise"]}


def _tag(name: str, prompt: str) -> str | None:
    match = _TAG[name].search(prompt)
    return match.group(1).strip() if match else None


def _score_json(score: float) -> str:
    # An integer reads as n/10; anything else is written "x/10" (a bare 0.8 would read as a fraction of 1).
    return json.dumps({"score": int(score) if score == int(score) else f"{score:.3f}/10"})


def _handler(judge: StandInJudge) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                return self._send(404, {"error": f"no route {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                text = judge.reply(str(body["messages"][-1]["content"]))
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                return self._send(400, {"error": f"{type(exc).__name__}: {exc}"})
            self._send(200, {"id": "standin", "object": "chat.completion", "model": body.get("model", ""),
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": text}}]})

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/").endswith("/stats"):
                return self._send(200, {**judge.stats(), "config": asdict(judge.cfg)})
            self._send(404, {"error": f"no route {self.path}"})

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass  # one line per request would drown a training run's output

    return Handler


class JudgeServer:
    """The stand-in judge on 127.0.0.1 in a background thread; `base_url` is what the trainer is given.

    Use as a context manager: `with JudgeServer(cfg) as server: ... server.judge.calls`.
    """

    def __init__(self, cfg: StandInConfig, port: int = 0, host: str = "127.0.0.1"):
        self.judge = StandInJudge(cfg)
        self.httpd = ThreadingHTTPServer((host, port), _handler(self.judge))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> JudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(CONFIG), help="YAML file with a judge: section")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--log", type=Path, default=None, help="write every call as a JSON line here on exit")
    for f in fields(StandInConfig):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=None)
    args = parser.parse_args(argv)
    cfg = StandInConfig.load(args.config, **{f.name: getattr(args, f.name) for f in fields(StandInConfig)})
    server = JudgeServer(cfg, port=args.port)
    print(f"stand-in judge at {server.base_url} ({json.dumps(asdict(cfg))})", flush=True)
    # a background job ignores SIGINT: SIGTERM (kill PID) ends the server too, and the log is written
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
        if args.log is not None:
            args.log.write_text("".join(json.dumps(c) + "\n" for c in server.judge.calls))


if __name__ == "__main__":
    main()
