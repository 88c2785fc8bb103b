"""``make soak`` (shell): a local two-replica cluster under steady mixed load, first
unfaulted, then with a random replica or engine SIGKILLed every ``--kill-every-s`` and a
poison request sent every ``--poison-every-s``; prints what the answers add up to
(tools/soak/report.py) and the cluster's processes and memory at start and end.

    .venv/bin/python -m tools.soak.run --minutes 20

Every request of the load is one of a fixed set (short, long, streamed, seeded, with stop
strings, with penalties), each answered once before the load starts: that answer is what
every later answer of the same request must equal. The poison catalogue is what issue 44
lists: requests that once failed an engine or got a healthy one restarted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil
import yaml

from cluster.config import load_config
from tools import processes
from tools.cluster_processes import gone, replicas
from tools.soak.report import Answer, percentile, slope_per_minute, tally, verdict

REPO = Path(__file__).resolve().parents[2]
# The fault suite's cluster (two replicas per pool, short deadlines), with the engines'
# seeded sampling as pdserve serves it (the suite's config keeps vLLM's crashing rewind
# for its quarantine test).
BASE_CONFIG = REPO / "tests/integration/pdserve-faults.yaml"
LOG_DIR = REPO / ".cache" / "soak"
REQUEST_TIMEOUT_S = 600


@dataclass(frozen=True)
class Request:
    key: str     # names the request whose unfaulted answer applies
    kind: str
    body: dict
    stream: bool


def _words(count: int, salt: str) -> str:
    return " ".join(f"{salt}{i}" for i in range(count))


def workload(model: str, per_kind: int) -> list[Request]:
    """The fixed set of requests the load cycles through."""
    kinds = {
        "short": ({"max_tokens": 48, "temperature": 0}, 20, True),
        "long": ({"max_tokens": 16, "temperature": 0}, 260, False),
        "streamed_long": ({"max_tokens": 64, "temperature": 0}, 120, True),
        "seeded": ({"max_tokens": 48, "temperature": 1.0}, 30, True),
        "stop": ({"max_tokens": 64, "temperature": 0, "stop": ["w3", "\n\n"]}, 25, True),
        "penalties": ({"max_tokens": 48, "temperature": 0, "presence_penalty": 0.5,
                       "frequency_penalty": 0.3}, 25, True),
    }
    requests = []
    for kind, (params, words, stream) in kinds.items():
        for index in range(per_kind):
            body = {"model": model, "prompt": _words(words, f"{kind[:2]}{index}x"),
                    "ignore_eos": True, **params}
            if kind == "seeded":
                body["seed"] = index
            requests.append(Request(f"{kind}/{index}", kind, body, stream))
    return requests


def poisons(model: str) -> list[tuple[str, dict, int]]:
    """Each known poison request, and the status that answers it rightly."""
    base = {"model": model, "prompt": "poison w1 w2 w3", "max_tokens": 8}
    long_prompt = " ".join(f"p{uuid.uuid4().hex[:6]}" for _ in range(300))  # ~2,400 tokens
    return [
        ("seeded_chunked_n2", {**base, "prompt": long_prompt, "temperature": 1.0, "seed": 5,
                               "n": 2, "ignore_eos": True}, 200),
        ("logit_bias_out_of_vocab", {**base, "logit_bias": {"999999": 5}}, 400),
        ("allowed_token_ids_out_of_vocab", {**base, "allowed_token_ids": [999999]}, 400),
        ("reserved_vllm_xargs", {**base, "vllm_xargs": {"kv_transfer_params": "{}"}}, 400),
        ("n_4096", {**base, "n": 4096}, 400),
        ("logprobs_too_many", {**base, "logprobs": 100000}, 400),
        ("max_tokens_past_the_model", {**base, "max_tokens": 10**9}, 400),
    ]


def send(client: httpx.Client, url: str, request: Request, phase: str) -> Answer:
    """One request as a client sends it; the client's view of its end."""
    started = time.monotonic()
    try:
        if not request.stream:
            response = client.post(url, json=request.body, timeout=REQUEST_TIMEOUT_S)
            if response.status_code != 200:
                return Answer(request.kind, phase, response.status_code)
            choice = response.json()["choices"][0]
            return Answer(request.kind, phase, 200, choice["text"],
                          finished=choice.get("finish_reason") is not None)
        return _streamed(client, url, request, phase, started)
    except (httpx.HTTPError, ValueError, KeyError):
        return Answer(request.kind, phase, None)


def _streamed(client: httpx.Client, url: str, request: Request, phase: str,
              started: float) -> Answer:
    text, finished, error_code, ttft_s = [], False, None, None
    with client.stream("POST", url, json={**request.body, "stream": True},
                       timeout=REQUEST_TIMEOUT_S) as response:
        if response.status_code != 200:
            response.read()
            return Answer(request.kind, phase, response.status_code)
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                error_code = event["error"].get("code") or 500
                error_code = error_code if isinstance(error_code, int) else 500
                continue
            for choice in event.get("choices", []):
                if choice.get("text"):
                    ttft_s = ttft_s if ttft_s is not None else time.monotonic() - started
                    text.append(choice["text"])
                finished = finished or choice.get("finish_reason") is not None
    return Answer(request.kind, phase, 200, "".join(text), finished, error_code, ttft_s)


@dataclass
class Run:
    """What the soak saw, gathered by its threads."""

    answers: list[tuple[str | None, Answer]] = field(default_factory=list)
    kills: list[dict] = field(default_factory=list)
    memory: list[tuple[float, float, int]] = field(default_factory=list)  # t, PSS MiB, procs
    engines_seen: set[int] = field(default_factory=set)  # every engine core pid seen
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str | None, answer: Answer) -> None:
        with self.lock:
            self.answers.append((key, answer))


def load(url: str, requests: list[Request], run: Run, phase: str, until: float,
         seed: int) -> None:
    """One closed-loop client: the next request of a shuffled cycle, until ``until``."""
    rng = random.Random(seed)
    with httpx.Client() as client:
        while time.monotonic() < until:
            request = rng.choice(requests)
            run.add(request.key, send(client, url, request, phase))


def engine_pids() -> dict[int, str]:
    """Every engine core now, by pid, with its pool."""
    return {core.pid: pool for pool in ("prefill", "decode")
            for _, cores in replicas(f"{pool}-v1") for core in cores}


def kill_one(rng: random.Random) -> dict:
    """SIGKILL a random replica actor or engine core of a random pool; what was killed
    (with the engine cores that go with it)."""
    pool = rng.choice(["prefill", "decode"])
    found = [(actor, cores) for actor, cores in replicas(f"{pool}-v1") if cores]
    if not found:
        return {"pool": pool, "target": "none ready", "cores": []}
    actor, cores = rng.choice(found)
    target = rng.choice(["replica", "engine"])
    victim = actor if target == "replica" else cores[0]
    try:
        victim.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        return {"pool": pool, "target": "gone before the kill", "cores": []}
    return {"pool": pool, "target": target, "pid": victim.pid,
            "cores": [core.pid for core in cores], "at": time.monotonic()}


def faults(run: Run, until: float, kill_every_s: float, seed: int) -> None:
    rng = random.Random(seed)
    next_kill = time.monotonic() + kill_every_s
    while (now := time.monotonic()) < until:
        if now >= next_kill:
            run.kills.append(kill_one(rng))
            next_kill += kill_every_s
        time.sleep(0.5)


def poisoning(url: str, model: str, run: Run, until: float, every_s: float) -> None:
    catalogue = poisons(model)
    turn = 0
    with httpx.Client() as client:
        while time.monotonic() + every_s < until:
            time.sleep(every_s)
            name, body, expected = catalogue[turn % len(catalogue)]
            turn += 1
            answer = send(client, url, Request("", f"poison:{name}", body, False), "faulted")
            run.add(None, Answer(**{**asdict(answer), "expected_status": expected}))


def cluster_memory(root: int) -> tuple[float, int]:
    """Memory (PSS, MiB: shared pages divided among the processes that share them, so
    the sum means something) and count of ``root``, every process under it, and every Ray or vLLM
    process elsewhere (one that outlived its parent is reparented out of the tree)."""
    tree = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = {p.pid: p for p in [psutil.Process(root),
                                   *psutil.Process(root).children(recursive=True)]}
    for process in psutil.process_iter(["name"]):
        if (process.info["name"] or "").startswith(("ray::", "VLLM::")):
            tree.setdefault(process.pid, process)
    pss = 0
    for process in tree.values():
        try:
            pss += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return pss / 2**20, len(tree)


def watch(run: Run, root: int, until: float, every_s: float, started: float,
          stop: threading.Event) -> None:
    """The cluster's memory every ``every_s`` and its engine cores every second (a core
    that disappears without a kill of ours explaining it was restarted by something
    else: a request)."""
    next_sample = 0.0
    while time.monotonic() < until and not stop.is_set():
        run.engines_seen.update(engine_pids())
        if (now := time.monotonic()) >= next_sample:
            rss, count = cluster_memory(root)
            run.memory.append((now - started, rss, count))
            next_sample = now + every_s
        stop.wait(1)


def wait_whole(url: str, replicas_per_pool: dict[str, int], timeout_s: float) -> bool:
    """Both pools back to their replicas, each with an engine, and the router answering."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = all(len([1 for _, cores in replicas(f"{pool}-v1") if cores]) >= count
                    for pool, count in replicas_per_pool.items())
        try:
            healthy = httpx.get(f"{url}/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            healthy = False
        if ready and healthy:
            return True
        time.sleep(1)
    return False


def soak_config(path: Path) -> Path:
    """The fault suite's config with the engines' seeded sampling as pdserve serves it."""
    config = yaml.safe_load(BASE_CONFIG.read_text())
    config["decode"]["env"].pop("PDSERVE_SEEDED_CPU", None)
    path.write_text(yaml.safe_dump(config))
    return path


def phase(url: str, requests: list[Request], run: Run, name: str, seconds: float,
          clients: int, extra=()) -> None:
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=load, args=(url, requests, run, name, until, i))
               for i in range(clients)]
    threads += [threading.Thread(target=target, args=(*args_of(until),))
                for target, args_of in extra]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20, help="the faulted phase")
    parser.add_argument("--unfaulted-minutes", type=float, default=3)
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients")
    parser.add_argument("--per-kind", type=int, default=6, help="requests of each kind")
    parser.add_argument("--kill-every-s", type=float, default=60)
    parser.add_argument("--poison-every-s", type=float, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    config_path = soak_config(LOG_DIR / "soak.yaml")
    config = load_config(config_path)
    url = f"http://{config.router.host}:{config.router.port}"
    completions = f"{url}/v1/completions"
    requests = workload(config.model.name, args.per_kind)
    server = processes.start_pdserve(config_path, config, LOG_DIR, REPO, name="soak")
    with processes.running(server):
        references = reference_answers(completions, requests)
        run, started, stop = Run(), time.monotonic(), threading.Event()
        watcher_until = started + 60 * (args.unfaulted_minutes + args.minutes) + 600
        watcher = threading.Thread(target=watch, daemon=True, args=(
            run, server.process.pid, watcher_until, 30, started, stop))
        watcher.start()
        phase(completions, requests, run, "unfaulted", 60 * args.unfaulted_minutes,
              args.clients)
        phase(completions, requests, run, "faulted", 60 * args.minutes, args.clients, extra=[
            (faults, lambda until: (run, until, args.kill_every_s, args.seed)),
            (poisoning, lambda until: (completions, config.model.name, run, until,
                                       args.poison_every_s))])
        whole = wait_whole(url, {"prefill": config.prefill.replicas,
                                 "decode": config.decode.replicas}, 300)
        stop.set()
        watcher.join()
        run.memory.append((time.monotonic() - started, *cluster_memory(server.process.pid)))
        summary = summarise(run, references, engines_restarted_unexplained(run), whole)
    (LOG_DIR / "soak.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, args)
    return 0 if summary["pass"] else 1


def reference_answers(url: str, requests: list[Request]) -> dict[str, str]:
    """Each request's unfaulted answer, one at a time on an idle cluster."""
    references = {}
    with httpx.Client() as client:
        for request in requests:
            answer = send(client, url, request, "reference")
            if verdict(answer, None) != "ok":
                raise SystemExit(f"reference answer for {request.key} failed: {answer}")
            references[request.key] = answer.text
    return references


def engines_restarted_unexplained(run: Run) -> list[int]:
    """Engine cores seen during the run that are gone without a kill of ours explaining
    it (the killed replica's or engine's own cores)."""
    killed = {pid for kill in run.kills for pid in kill.get("cores", [])}
    return sorted(pid for pid in run.engines_seen if pid not in killed and gone([pid]))


def summarise(run: Run, references: dict[str, str], unexplained: list[int],
              whole: bool) -> dict:
    answers = [answer for _, answer in run.answers]
    keys = {id(answer): key for key, answer in run.answers}
    counts = tally(answers, references, lambda answer: keys[id(answer)])
    ttft = {name: [a.ttft_s for a in answers if a.phase == name and a.ttft_s is not None
                   and verdict(a, references.get(keys[id(a)])) == "ok"]
            for name in ("unfaulted", "faulted")}
    poison = [a for a in answers if a.kind.startswith("poison:")]
    by_poison: dict[str, dict[str, int]] = {}
    for answer in poison:
        entry = by_poison.setdefault(answer.kind[len("poison:"):], {})
        entry[str(answer.status)] = entry.get(str(answer.status), 0) + 1
    faulted = counts.get("faulted", {})
    not_ok: dict[str, int] = {}
    for answer in answers:
        judged = verdict(answer, references.get(keys[id(answer)]))
        if judged not in ("ok", "refused"):
            name = f"{answer.phase} {answer.kind}: {judged}"
            not_ok[name] = not_ok.get(name, 0) + 1
    memory = run.memory
    summary = {
        "counts": {name: dict(counter) for name, counter in counts.items()},
        "poison": by_poison,
        "not_ok_by_kind": not_ok,
        "kills": len(run.kills),
        "kill_targets": [f"{k['pool']} {k['target']}" for k in run.kills],
        "ttft_p50_s": {n: percentile(v, 0.5) for n, v in ttft.items()},
        "ttft_p95_s": {n: percentile(v, 0.95) for n, v in ttft.items()},
        "processes": {"start": memory[0][2] if memory else None,
                      "end": memory[-1][2] if memory else None},
        "pss_mib": {"start": memory[0][1] if memory else None,
                    "end": memory[-1][1] if memory else None,
                    "slope_per_min": slope_per_minute([(t, pss) for t, pss, _ in memory])},
        "engines_restarted_unexplained": unexplained,
        "whole_at_end": whole,
    }
    summary["pass"] = (whole and not unexplained
                       and all(faulted.get(v, 0) == 0 for v in
                               ("lost", "truncated", "altered", "5xx", "wrong_status"))
                       and all(counts.get("unfaulted", {}).get(v, 0) == 0 for v in
                               ("lost", "truncated", "altered", "5xx", "wrong_status",
                                "migration_refused")))
    return summary


def print_summary(summary: dict, args) -> None:
    print(f"\nsoak: {args.unfaulted_minutes:g} min unfaulted, then {args.minutes:g} min "
          f"with a kill every {args.kill_every_s:g} s and a poison every "
          f"{args.poison_every_s:g} s, {args.clients} clients")
    for name, counts in summary["counts"].items():
        print(f"  {name:10} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"  poison     {summary['poison']}")
    print(f"  not ok     {summary['not_ok_by_kind']}")
    print(f"  kills      {summary['kills']}: {', '.join(summary['kill_targets'])}")
    for quantile in ("ttft_p50_s", "ttft_p95_s"):
        values = summary[quantile]
        print(f"  {quantile:10} " + ", ".join(
            f"{n} {v * 1000:.0f} ms" if v is not None else f"{n} -" for n, v in values.items()))
    pss = summary["pss_mib"]
    slope = pss["slope_per_min"]
    print(f"  processes  {summary['processes']['start']} at start, "
          f"{summary['processes']['end']} at the end; PSS {pss['start']:.0f} MiB at start, "
          f"{pss['end']:.0f} MiB at the end, slope "
          f"{'-' if slope is None else f'{slope:+.1f} MiB/min'}")
    print(f"  engines restarted unexplained: {summary['engines_restarted_unexplained']}; "
          f"whole at the end: {summary['whole_at_end']}")
    print("PASS" if summary["pass"] else "FAIL")


if __name__ == "__main__":
    sys.exit(main())
