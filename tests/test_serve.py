"""deepnmt-serve (issue 79): the HTTP API, dynamic batching, errors, limits, the API key, graceful
shutdown and the faults of the issue, against a tiny model in the export's directory format.

The model is written without torch by ``benchmarks/serve_load.py``'s ``write_random_model`` (an
untrained 2-1 pre-norm Transformer, width 16, 24 positions: under a second; the export's fidelity to
fairseq is ``test_deploy.py``'s).  Servers run in a thread of the test process (uvicorn on a socket
bound to a free loopback port), or as ``python -m deepnmt_deploy.serve`` where a signal or the
process's exit status is tested.  The batching tests hold the model call on a gate, so that the
queue's contents are known when a request arrives.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2", reason="CTranslate2 is not installed: pip install '.[deploy]'")
pytest.importorskip("starlette", reason="the server's dependencies are not installed: pip install '.[deploy]'")
pytest.importorskip("uvicorn", reason="the server's dependencies are not installed: pip install '.[deploy]'")
pytest.importorskip("prometheus_client", reason="the server's dependencies are not installed: pip install '.[deploy]'")
httpx = pytest.importorskip("httpx", reason="the tests' HTTP client is not installed: pip install '.[test]'")

from deepnmt_deploy import serve  # noqa: E402
from deepnmt_deploy.serve import App, ServeConfig, make_server  # noqa: E402
from deepnmt_deploy.translate import DeployedModel  # noqa: E402
from serve_load import metric, write_random_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORDS = "the a cat dog sees eats big small red blue house tree runs jumps over under near far".split()
LINES = ["the cat sees a dog", "", "big red house near the tree", "a dog runs over the small blue house",
         "zebra café — naïve “quotes”", "the   dog\tjumps", "far far far", "tree"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_random_model(tmp_path_factory.mktemp("serve") / "tiny", WORDS + [w.upper() for w in WORDS]))


@pytest.fixture(scope="module")
def deployed(model_dir):
    return DeployedModel(model_dir)


@contextlib.contextmanager
def running(app: App, ready=True):
    """uvicorn serving ``app`` in a thread on a free loopback port; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = make_server(app, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    t0 = time.time()
    while not server.started or (ready and app.model is None):
        assert thread.is_alive() and time.time() - t0 < 30, "the server did not start"
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


def make_app(model_dir, load=None, **kw) -> App:
    return App(ServeConfig(model_dir=model_dir, **kw), load=load)


class Gated:
    """The deployed model, its calls held until ``gate`` opens; ``calls`` counts sentences per call."""

    def __init__(self, model):
        self.model, self.gate, self.calls = model, threading.Event(), []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def translate_tokens(self, sources, **search):
        self.calls.append(len(sources))
        assert self.gate.wait(30)
        return self.model.translate_tokens(sources, **search)


def post(url, body, **kw):
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    return httpx.post(url + "/v1/translate", content=body, headers=headers, timeout=60, **kw)


def wait_for(cond, timeout=10):
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout
        time.sleep(0.01)


# ---------------------------------------------------------------- the API
def test_one_request_is_byte_identical_to_deepnmt_translate(model_dir, deployed, tmp_path):
    """One request holding the lines = deepnmt-translate with the same batch size on those lines."""
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    res = subprocess.run([sys.executable, "-m", "deepnmt_deploy.translate", "--model", model_dir, "--input", str(src),
                          "--output", str(tmp_path / "out.txt"), "--batch-size", "32", "--no-progress"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 0, res.stderr[-2000:]
    with running(make_app(model_dir, batch_size=32)) as url:
        r = post(url, {"text": LINES})
        assert r.status_code == 200, r.text
        body = r.json()
        assert ("\n".join(body["translations"]) + "\n").encode() == (tmp_path / "out.txt").read_bytes()
        assert body["model"] == "tiny" and body["elapsed_ms"] > 0 and body["translations"][1] == ""
        assert len(set(body["translations"])) > 3  # the lines are translated, not one answer for all
        # the request's beam is the search's
        r2 = post(url, {"text": LINES[:4], "beam": 2})
        assert r2.json()["translations"] == list(deployed.translate_lines(LINES[:4], beam=2, batch_size=32))
        # empty list -> empty list
        r3 = post(url, {"text": []})
        assert r3.status_code == 200 and r3.json()["translations"] == []


def _status_counts(url, key=None):
    text = httpx.get(url + "/metrics", headers={"X-API-Key": key} if key else {}).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'^deepnmt_requests_total\{status="(\d+)"\} (\S+)$',
                                                                text, re.M)}


BAD_UTF8 = b'{"text": ["the caf\xe9 au lait"]}'  # Latin-1, not UTF-8


def test_bad_input_gets_a_clear_error_and_harms_no_one(model_dir, deployed):
    app = make_app(model_dir, max_body_bytes=2000, max_sentences=5, max_beam=8)
    with running(app) as url:
        good = {"text": LINES[:3]}
        expect = list(deployed.translate_lines(LINES[:3], batch_size=32))
        cases = [
            # (body, headers, status, words the error must name)
            ({"text": ["a " * 1500]}, {}, 413, ["2000 bytes", "--max-body-bytes"]),
            (b"{not json", {}, 400, ["not JSON", "line 1 column 2"]),
            ({"txt": ["a"]}, {}, 400, ["'txt'"]),
            ({}, {}, 400, ["'text'", "missing"]),
            ({"text": "a cat"}, {}, 400, ["'text'", "list of strings"]),
            ({"text": ["a", 3]}, {}, 400, ["'text[1]'", "string"]),
            ([1, 2], {}, 400, ["JSON object"]),
            ({"text": ["a"], "beam": "5"}, {}, 400, ["'beam'", "integer"]),
            (BAD_UTF8, {}, 400, ["UTF-8", f"byte offset {BAD_UTF8.index(0xE9)}", "xe9"]),
            ({"text": ["a"] * 6}, {}, 422, ["6 sentences", "5", "--max-sentences"]),
            ({"text": ["the cat", "dog " * 30]}, {}, 422, ["'text[1]'", "30 subword tokens", "limit is 23"]),
            ({"text": ["a"], "beam": 9}, {}, 422, ["'beam'", "8", "--max-beam"]),
            ({"text": ["a"]}, {"Content-Type": "text/plain"}, 415, ["application/json"]),
            ({"text": ["a"]}, {"Content-Type": ""}, 415, ["application/json"]),
        ]
        for body, headers, status, words in cases:
            r = post(url, body, headers=headers)
            assert r.status_code == status, (body, r.text)
            err = r.json()
            assert err["status"] == status
            for w in words:
                assert w in err["error"], (w, err)
            # the good request next to it is untouched
            assert post(url, good).json()["translations"] == expect
        r = httpx.get(url + "/v1/translate")
        assert r.status_code == 405 and r.headers["allow"] == "POST" and "GET" in r.json()["error"]
        r = httpx.put(url + "/v1/translate", json=good)
        assert r.status_code == 405
        # a body streamed without Content-Length is cut at the limit too
        r = httpx.post(url + "/v1/translate", content=iter([b'{"text": ["' + b"a " * 800, b"a " * 800 + b'"]}']),
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "2000" in r.json()["error"]
        # bad requests sent at the same time as good ones: each answered for itself
        results = {}

        def send(k, body):
            results[k] = post(url, body)

        threads = [threading.Thread(target=send, args=(k, good if k % 2 else {"text": [1]})) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, r in results.items():
            if k % 2:
                assert r.status_code == 200 and r.json()["translations"] == expect
            else:
                assert r.status_code == 400 and "'text[0]'" in r.json()["error"]
        counts = _status_counts(url)
        expected = {"200": len(cases) + 4, "400": 4, "405": 2, "413": 1}
        for _, _, status, _ in cases:
            expected[str(status)] = expected.get(str(status), 0) + 1
        assert counts == expected


# ---------------------------------------------------------------- batching, queue, timeout
def test_concurrent_requests_are_batched(model_dir, deployed):
    """N concurrent requests run in fewer than N model calls, each answered with its own lines."""
    gated = Gated(deployed)
    app = make_app(model_dir, load=lambda: gated, max_batch_tokens=4096)
    requests = [[LINES[k % len(LINES)], LINES[(3 * k + 1) % len(LINES)]] for k in range(8)]
    results = {}
    with running(app) as url:
        def send(k):
            results[k] = post(url, {"text": requests[k]})

        first = threading.Thread(target=send, args=(0,))
        first.start()
        wait_for(lambda: gated.calls)  # request 0 is in the model; the others queue behind it
        others = [threading.Thread(target=send, args=(k,)) for k in range(1, 8)]
        for t in others:
            t.start()
        wait_for(lambda: app.batcher.queued_sentences == 14)
        gated.gate.set()
        for t in [first, *others]:
            t.join()
        metrics = httpx.get(url + "/metrics").text
    assert gated.calls == [2, 14]  # 8 requests, 2 model calls
    assert metric(metrics, "deepnmt_batches_total") == 2
    assert 'deepnmt_batch_requests_bucket{le="8.0"} 2.0' in metrics
    assert metric(metrics, "deepnmt_source_tokens_total") == sum(len(deployed.encode(s)) + 1
                                                                 for r in requests for s in r if s.strip())
    assert metric(metrics, "deepnmt_target_tokens_total") > 0 and metric(metrics, "deepnmt_queue_depth") == 0
    for k, lines in enumerate(requests):
        assert results[k].status_code == 200
        assert results[k].json()["translations"] == list(deployed.translate_lines(lines, batch_size=32))


def test_token_budget_and_beam_split_batches(model_dir, deployed):
    """A batch takes queued requests while their source tokens fit --max-batch-tokens and only those
    with the batch's beam."""
    gated = Gated(deployed)
    app = make_app(model_dir, load=lambda: gated, max_batch_tokens=12)
    bodies = [{"text": ["a"]}, {"text": ["the cat sees a dog"]}, {"text": ["big red house"]},  # 6 + 4 tokens
              {"text": ["the dog"], "beam": 2}, {"text": ["far tree"]}]
    results = {}
    with running(app) as url:
        def send(k):
            results[k] = post(url, bodies[k])

        threads = [threading.Thread(target=send, args=(0,))]
        threads[0].start()
        wait_for(lambda: gated.calls)
        for k in range(1, len(bodies)):
            threads.append(threading.Thread(target=send, args=(k,)))
            threads[-1].start()
            wait_for(lambda: len(app.batcher.queue) == k)  # queued in this order
        gated.gate.set()
        for t in threads:
            t.join()
    # [a] | [the cat sees a dog, big red house] (10 tokens; + far tree would be 13) | [far tree] | beam 2
    assert gated.calls == [1, 2, 1, 1]
    for k, b in enumerate(bodies):
        assert results[k].json()["translations"] == list(deployed.translate_lines(b["text"], beam=b.get("beam", 5)))


def test_full_queue_answers_503_and_timeout_504(model_dir, deployed):
    gated = Gated(deployed)
    app = make_app(model_dir, load=lambda: gated, max_queue=2, request_timeout=1.5)
    results = {}
    with running(app) as url:
        def send(k, body):
            results[k] = post(url, body)

        a = threading.Thread(target=send, args=("a", {"text": ["the cat"]}))
        a.start()
        wait_for(lambda: gated.calls)
        b = threading.Thread(target=send, args=("b", {"text": ["a dog", "big house"]}))
        b.start()
        wait_for(lambda: app.batcher.queued_sentences == 2)
        full = post(url, {"text": ["tree"]})
        assert full.status_code == 503 and full.headers["retry-after"] == "1"
        assert "--max-queue" in full.json()["error"] and full.json()["limit"] == "max_queue"
        a.join()
        b.join()  # nobody opened the gate: both waited --request-timeout
        for k in "ab":
            assert results[k].status_code == 504 and "--request-timeout" in results[k].json()["error"]
        gated.gate.set()
        # the timed-out request b never reached the model, and the server serves again
        r = post(url, {"text": ["the cat"]})
        assert r.status_code == 200 and r.json()["translations"] == list(deployed.translate_lines(["the cat"]))
        wait_for(lambda: app.batcher.queued_sentences == 0)
    assert gated.calls == [1, 1]


def test_health_waits_for_the_model(model_dir, deployed):
    loaded = threading.Event()

    def load():
        assert loaded.wait(30)
        return deployed

    app = make_app(model_dir, load=load)
    with running(app, ready=False) as url:
        h = httpx.get(url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "loading"
        r = post(url, {"text": ["the cat"]})
        assert r.status_code == 503 and "not loaded" in r.json()["error"] and r.headers["retry-after"]
        loaded.set()
        wait_for(lambda: httpx.get(url + "/health").status_code == 200)
        assert httpx.get(url + "/health").json() == {"status": "ready", "model": "tiny"}
        assert post(url, {"text": ["the cat"]}).status_code == 200

    app = make_app(model_dir, load=lambda: DeployedModel(model_dir + "-missing"))
    with running(app, ready=False) as url:
        wait_for(lambda: app.load_error is not None)
        h = httpx.get(url + "/health")
        assert h.status_code == 503 and h.json()["status"] == "failed" and "missing" in h.json()["error"]


# ---------------------------------------------------------------- safe defaults
def test_api_key_and_cors(model_dir, monkeypatch):
    compared = []
    real = serve.hmac.compare_digest
    monkeypatch.setattr(serve.hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    with running(make_app(model_dir, api_key="s3cret")) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "s3cre"}, {"Authorization": "s3cret"}):
            r = post(url, {"text": ["the cat"]}, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", headers
            assert "API key" in r.json()["error"]
        assert len(compared) == 2  # the two keys given were compared in constant time
        for headers in ({"Authorization": "Bearer s3cret"}, {"X-API-Key": "s3cret"}):
            assert post(url, {"text": ["the cat"]}, headers=headers).status_code == 200
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/metrics", headers={"X-API-Key": "s3cret"}).status_code == 200
        assert httpx.get(url + "/health").status_code == 200
        assert 'id="apikey"' in httpx.get(url + "/").text
        # no CORS unless asked for
        r = httpx.options(url + "/v1/translate", headers={"Origin": "https://example.org",
                                                          "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in r.headers
    with running(make_app(model_dir, cors_origins=["https://example.org"])) as url:
        r = httpx.options(url + "/v1/translate", headers={"Origin": "https://example.org",
                                                          "Access-Control-Request-Method": "POST"})
        assert r.headers["access-control-allow-origin"] == "https://example.org"
        r = httpx.options(url + "/v1/translate", headers={"Origin": "https://evil.example",
                                                          "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in r.headers
        assert 'id="apikey"' not in httpx.get(url + "/").text


def test_flags_defaults_and_environment(model_dir, monkeypatch):
    p = serve.build_parser()
    a = p.parse_args(["--model", model_dir])
    assert a.host == "127.0.0.1" and a.port == 8080 and a.cors_origin == []
    assert serve.config_from_args(a).use_vmap is None  # as deepnmt-translate: the export's shortlist if any
    assert serve.config_from_args(p.parse_args(["--model", model_dir, "--no-vmap"])).use_vmap is False
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    assert serve.config_from_args(a).api_key is None
    monkeypatch.setenv(serve.API_KEY_ENV, "from-env")
    assert serve.config_from_args(a).api_key == "from-env"
    assert serve.config_from_args(p.parse_args(["--model", model_dir, "--api-key", "flag"])).api_key == "flag"
    res = subprocess.run([sys.executable, "-m", "deepnmt_deploy.serve", "--model", model_dir + "-missing"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 2 and "deepnmt_export.json missing" in res.stderr
    res = subprocess.run([sys.executable, "-m", "deepnmt_deploy.serve", "--model", model_dir, "--max-queue", "0"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert res.returncode == 2 and "--max-queue must be at least 1" in res.stderr


def test_entry_points():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    for path in ("pyproject.toml", "deploy-dist/pyproject.toml"):
        scripts = tomllib.loads((REPO / path).read_text())["project"]["scripts"]
        assert scripts["deepnmt-serve"] == "deepnmt_deploy.serve:main", path


# ---------------------------------------------------------------- the page
def test_page_loads_nothing_from_elsewhere(model_dir):
    with running(make_app(model_dir, name="tiny <test>")) as url:
        r = httpx.get(url + "/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in r.headers["content-security-policy"]
        page = r.text
        assert "tiny &lt;test&gt;" in page and "<textarea" in page and 'id="translate"' in page
        js = httpx.get(url + "/page.js").text
        assert "/v1/translate" in js
        for text in (page, js):
            assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text)
            assert "http://" not in text and "https://" not in text


def _chromium():
    import shutil

    for name in ("/usr/lib/chromium/chromium", "chromium", "chromium-browser"):
        path = shutil.which(name) or (name if os.path.isfile(name) else None)
        if path:
            return path
    return None


def test_page_in_headless_chromium(model_dir, deployed):
    """Type a sentence into the page in a real headless Chromium, press Translate, read the result.
    DEEPNMT_SCREENSHOT=PATH saves a screenshot (docs/img/serve-page.png was made so)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed: pip install playwright")
    browser_path = _chromium()
    if browser_path is None:
        pytest.skip("no Chromium: install Debian's chromium package (apt-get install chromium) for the browser test")
    sentence = "the cat sees a dog"
    with running(make_app(model_dir, name="tiny-random-test-model")) as url:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=browser_path, headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                page = browser.new_page(viewport={"width": 900, "height": 520})
                outside = []
                page.on("request", lambda req: req.url.startswith(url) or outside.append(req.url))
                page.goto(url + "/")
                assert page.inner_text("#model") == "tiny-random-test-model"
                page.fill("#source", sentence)
                page.click("#translate")
                # polled from here: the page's CSP allows no evaluated script (wait_for_function)
                wait_for(lambda: page.inner_text("#status").endswith(" ms"), 20)
                assert page.inner_text("#result") == list(deployed.translate_lines([sentence]))[0]
                assert outside == []
                if os.environ.get("DEEPNMT_SCREENSHOT"):
                    page.screenshot(path=os.environ["DEEPNMT_SCREENSHOT"])
            finally:
                browser.close()


# ---------------------------------------------------------------- faults
def test_client_disconnecting_mid_request(model_dir, deployed):
    app = make_app(model_dir, max_wait_ms=300)
    with running(app) as url:
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({"text": ["the cat sees a dog"]}).encode()
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            s.close()  # gone before the batch's 300 ms wait is over
        r = post(url, {"text": ["big red house"]})
        assert r.status_code == 200 and r.json()["translations"] == list(deployed.translate_lines(["big red house"]))
        wait_for(lambda: app.answered == app.accepted)  # the gone clients' requests ran and were dropped
        assert app.accepted == 4 and httpx.get(url + "/health").status_code == 200


def test_thousand_idle_connections(model_dir, deployed):
    """1,000 open idle connections: the server answers another client as usual.  The server needs
    one file descriptor per open connection (plus ~30 of its own): raise `ulimit -n` above them."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2200  # the 1,000 client sockets and the server's 1,000 in this one process
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"the hard limit of open files is {hard}, under the {need} this test needs")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    app = make_app(model_dir)
    socks = []
    try:
        with running(app) as url:
            port = int(url.rsplit(":", 1)[1])
            for _ in range(1000):
                socks.append(socket.create_connection(("127.0.0.1", port)))
            t0 = time.time()
            r = post(url, {"text": ["the dog runs"]})
            assert r.status_code == 200 and r.json()["translations"] == list(deployed.translate_lines(["the dog runs"]))
            assert time.time() - t0 < 10
            for s in socks:
                s.close()
            socks = []
    finally:
        for s in socks:
            s.close()
        if soft < need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_fifty_megabyte_body(model_dir, deployed):
    """A 50 MB body is refused (413) from its Content-Length, not read into memory."""
    app = make_app(model_dir)
    with running(app) as url:
        port = int(url.rsplit(":", 1)[1])
        size = 50 * 1024 * 1024
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % size)
        chunk = b'{"text": ["' + b"a" * (1024 * 1024 - 11)
        sent = 0
        s.settimeout(10)
        with contextlib.suppress(OSError):
            while sent < size:  # the server answers and closes long before the body is sent
                s.sendall(chunk[: min(len(chunk), size - sent)])
                sent += len(chunk)
                if sent >= 4 * len(chunk):
                    break
        data = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                more = s.recv(65536)
                if not more:
                    break
                data += more
        s.close()
        assert data.startswith(b"HTTP/1.1 413"), data[:200]
        err = json.loads(data.split(b"\r\n\r\n", 1)[1])
        assert f"{size} bytes" in err["error"] and "--max-body-bytes" in err["error"]
        r = post(url, {"text": ["the cat"]})
        assert r.status_code == 200 and r.json()["translations"] == list(deployed.translate_lines(["the cat"]))


def test_sigterm_under_load_answers_every_accepted_request(model_dir, tmp_path):
    """SIGTERM while 12 clients send: the port closes, every request the server accepted is answered,
    the process exits 0, and the requests sent = answered + refused (connection refused)."""
    from serve_load import free_port, start_server, wait_ready

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(model_dir, port, ["--max-wait-ms", "1000"])
    try:
        wait_ready(url, proc, timeout=60)
        counts = {"sent": 0, "ok": 0, "refused": 0, "other": [], "after_term": 0}
        lock = threading.Lock()
        stop = threading.Event()
        term_at = [None]

        def client(k):
            while not stop.is_set():
                with lock:
                    counts["sent"] += 1
                try:  # a new connection per request: a refused one is refused at connect
                    r = httpx.post(url + "/v1/translate", json={"text": [LINES[k % 4]]}, timeout=30)
                    key = "ok" if r.status_code == 200 else None
                except (httpx.ConnectError, httpx.RemoteProtocolError):
                    # refused at connect, or (RemoteProtocolError) a connection the kernel queued in the
                    # listening socket's backlog and the server closed unread as it shut down: never
                    # accepted (the server's own count below says every accepted request was answered)
                    key = "refused"
                    stop.wait(0.05)
                except httpx.HTTPError as e:
                    key = None
                    r = e
                with lock:
                    if key:
                        counts[key] += 1
                        if key == "ok" and term_at[0] is not None:
                            counts["after_term"] += 1
                    else:
                        counts["other"].append(repr(r))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(12)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        # one more request, sent 0.25 s before the signal with a beam no client uses: a batch holds one
        # beam, so it is the first of its own batch and waits there --max-wait-ms (1 s) for more when
        # SIGTERM comes: accepted before the signal, answered after it
        probe = {}

        def send_probe():
            probe["response"] = httpx.post(url + "/v1/translate", json={"text": [LINES[0]], "beam": 2}, timeout=30)
            probe["at"] = time.time()

        prober = threading.Thread(target=send_probe)
        prober.start()
        time.sleep(0.25)
        term_at[0] = time.time()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join()
        prober.join()
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err[-3000:]
    assert counts["other"] == [], counts
    assert counts["sent"] == counts["ok"] + counts["refused"] and counts["refused"] > 0, counts
    m = re.search(r"shutdown: (\d+) translate requests accepted, (\d+) answered", err)
    assert m, err[-3000:]
    assert int(m.group(1)) == int(m.group(2)) == counts["ok"] + 1, (m.group(0), counts)  # + the probe
    # the request in the batch's wait when the signal came was answered, after the signal
    assert probe["response"].status_code == 200 and probe["at"] > term_at[0], probe


def test_server_imports_neither_torch_nor_fairseq(model_dir, tmp_path):
    """deepnmt-serve runs with torch, fairseq and deepnmt_fairseq unimportable (the serving wheel's
    environment has none of them: test_deploy.py installs it and starts the server there)."""
    blocked = tmp_path / "blocked"
    for name in ("torch", "fairseq", "deepnmt_fairseq"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked in this test')\n")
    code = ("import sys; from deepnmt_deploy import serve; from deepnmt_deploy.serve import App, ServeConfig; "
            "app = App(ServeConfig(model_dir=sys.argv[1])); m = serve._load_model(app.cfg); "
            "assert m.max_source_tokens == 23; "
            "assert not {'torch', 'fairseq', 'deepnmt_fairseq'} & set(sys.modules), sorted(sys.modules)")
    res = subprocess.run([sys.executable, "-c", code, model_dir], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked), str(REPO)])))
    assert res.returncode == 0, res.stderr[-3000:]
