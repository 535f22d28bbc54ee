"""The live dashboard of `dsv4 serve` (GET /dashboard and /dashboard/data) on the shipped tiny model on the CPU: the
data's counts match the requests made and /metrics, its percentiles are ordered, running requests show up in it,
and the page, loaded in headless Chromium (Debian's `chromium`, which tools/setup installs), draws its charts with
no script error. Its screenshot is kept as $DSV4_ARTIFACTS/dashboard.png (ctest: build/artifacts/).

Run by ctest (tests/server/tests.cmake) with the venv that tools/setup makes:
    DSV4_CLI=build/bin/dsv4 build/venv/bin/python -m unittest -v tests/server/test_dashboard.py
"""

import html.parser
import os
import shutil
import struct
import subprocess
import tempfile
import time
import unittest
import zlib
from concurrent.futures import ThreadPoolExecutor

import httpx

from test_openai import MODEL, PROMPTS, Server

CHROMIUM = shutil.which("chromium")
ARTIFACTS = os.environ.get("DSV4_ARTIFACTS", tempfile.gettempdir())
KEY = "dashboard-test-key"
REQUESTS, MAX_TOKENS = 8, 6
# The page's charts and their series (dashboard.html's CHARTS).
CHARTS = {"throughput": 2, "ttft": 3, "itl": 3, "requests": 2, "use": 3, "steps": 1}


def read_png(path):
    """(width, height, rows of RGB(A) tuples) of an 8-bit RGB or RGBA PNG, non-interlaced (what Chromium writes)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    channels = 3 if colour == 2 else 4
    stride = width * channels
    raw = zlib.decompress(idat)
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):  # undo the row's filter (PNG spec, section 9)
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, channels)])
        prev = line
    return width, height, rows


class Elements(html.parser.HTMLParser):
    """Every start tag of a document: (tag, attributes)."""

    def __init__(self, text):
        super().__init__()
        self.elements = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))


class TestDashboard(unittest.TestCase):
    """Eight requests through a server of two slots, then the dashboard's data and page (open: the API key guards
    /v1/ only)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max-seqs", "2", "--api-key", KEY, api_key=KEY)
        cls.http = cls.server.http

        def complete(prompt):
            return cls.server.client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                                        temperature=0, extra_body={"ignore_eos": True})

        with ThreadPoolExecutor(REQUESTS) as pool:
            cls.responses = list(pool.map(complete, PROMPTS[:REQUESTS]))
        cls.data = cls.wait_for(lambda d: d["totals"]["finished"] >= REQUESTS)

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        if code != 0:
            raise AssertionError(f"dsv4 serve exited with {code}:\n{''.join(cls.server.log)}")

    @classmethod
    def wait_for(cls, condition, timeout=30):
        """/dashboard/data once `condition` holds of it (samples come every second)."""
        deadline = time.monotonic() + timeout
        while True:
            data = cls.http.get("/dashboard/data").json()
            if condition(data):
                return data
            if time.monotonic() > deadline:
                raise AssertionError(f"the dashboard's data did not reach the expected state: {data}")
            time.sleep(0.2)

    def test_counts_match_the_requests(self):
        totals, samples = self.data["totals"], self.data["samples"]
        prompt_tokens = sum(r.usage.prompt_tokens for r in self.responses)
        self.assertEqual(totals["finished"], REQUESTS)
        self.assertEqual(totals["generation_tokens"], REQUESTS * MAX_TOKENS)
        self.assertEqual(totals["prompt_tokens"], prompt_tokens)
        self.assertEqual(totals["ttft_count"], REQUESTS)
        self.assertEqual(totals["itl_count"], REQUESTS * (MAX_TOKENS - 1))
        # Every step's rows: each prompt token once, and each generated token but the last fed back.
        self.assertEqual(totals["step_tokens"], prompt_tokens + REQUESTS * (MAX_TOKENS - 1))
        # The samples add up to the totals (ten minutes are kept: none has been dropped yet).
        for key in ("finished", "generation_tokens", "prompt_tokens", "steps", "step_tokens"):
            self.assertEqual(sum(s[key] for s in samples), totals[key], key)
        self.assertEqual(self.data["model"], MODEL)
        self.assertEqual(self.data["backend"], "cpu")
        self.assertEqual(self.data["slots"], 2)
        self.assertEqual((self.data["interval_s"], self.data["window_s"], self.data["capacity"]), (1, 10, 600))

    def test_samples_are_sane(self):
        samples = self.data["samples"]
        self.assertGreater(len(samples), 0)
        times = [s["t"] for s in samples]
        self.assertEqual(times, sorted(set(times)))
        latencies = 0
        for s in samples:
            self.assertGreater(s["seconds"], 0)
            self.assertAlmostEqual(s["generation_tokens_per_s"], s["generation_tokens"] / s["seconds"])
            self.assertAlmostEqual(s["prompt_tokens_per_s"], s["prompt_tokens"] / s["seconds"])
            self.assertTrue(0 <= s["running"] <= 2 and s["waiting"] >= 0, s)
            self.assertTrue(0 <= s["slot_use"] <= 1 and 0 <= s["token_use"] <= 1, s)
            self.assertTrue(0 <= s["engine_busy"] <= 1, s)
            if s["steps"]:
                self.assertAlmostEqual(s["tokens_per_step"], s["step_tokens"] / s["steps"])
            else:
                self.assertIsNone(s["tokens_per_step"])
            for key in ("ttft", "itl"):
                p = s[key]
                if p is None:
                    continue
                latencies += 1
                self.assertTrue(0 <= p["p50"] <= p["p90"] <= p["p99"], (key, p))
                self.assertGreater(p["count"], 0)
        self.assertGreater(latencies, 0)

    def test_running_requests_and_metrics_agree(self):
        # A long stream: the samples taken while it runs count it, and its tokens go up every second.
        stream = self.server.client.completions.create(model=MODEL, prompt="Mr. Darcy", max_tokens=2000,
                                                       temperature=0, stream=True,
                                                       extra_body={"ignore_eos": True})
        next(iter(stream))
        after = self.http.get("/dashboard/data").json()["samples"][-1]["t"]
        data = self.wait_for(lambda d: any(s["t"] > after and s["running"] == 1 for s in d["samples"]))
        sample = next(s for s in data["samples"] if s["t"] > after and s["running"] == 1)
        self.assertEqual(sample["slot_use"], 0.5)
        self.assertGreater(sample["token_use"], 0)
        stream.close()
        # Once idle, the last sample's totals are /metrics' counters.
        data = self.wait_for(lambda d: d["samples"][-1]["running"] == 0 and d["samples"][-1]["generation_tokens"] == 0)
        totals = data["totals"]
        metric = self.server.metric
        self.assertEqual(totals["generation_tokens"], metric("dsv4:generation_tokens_total"))
        self.assertEqual(totals["prompt_tokens"], metric("dsv4:prompt_tokens_total"))
        self.assertEqual(totals["steps"], metric("dsv4:engine_steps_total"))
        self.assertEqual(totals["step_tokens"], metric("dsv4:engine_step_tokens_total"))
        self.assertEqual(totals["ttft_count"], metric("dsv4:time_to_first_token_seconds_count"))
        self.assertEqual(totals["itl_count"], metric("dsv4:inter_token_latency_seconds_count"))
        self.assertEqual(totals["finished"], REQUESTS + 1)

    def test_since_access_and_errors(self):
        data = self.wait_for(lambda d: len(d["samples"]) >= 2)
        t = data["samples"][-2]["t"]
        later = self.http.get("/dashboard/data", params={"since": repr(t)}).json()
        self.assertTrue(later["samples"] and all(s["t"] > t for s in later["samples"]))
        self.assertEqual(later["samples"][0]["t"], data["samples"][-1]["t"])
        bad = self.http.get("/dashboard/data", params={"since": "yesterday"})
        self.assertEqual(bad.status_code, 400)
        self.assertEqual(bad.json()["error"]["param"], "since")
        self.assertEqual(self.http.post("/dashboard").status_code, 405)
        # The API key guards the API, not the dashboard (aggregates, as /metrics).
        self.assertEqual(self.http.get("/v1/models").status_code, 401)
        page = self.http.get("/dashboard")
        self.assertEqual(page.status_code, 200)
        self.assertTrue(page.headers["content-type"].startswith("text/html"))
        # Self-contained: nothing is loaded from elsewhere.
        for external in ("http://", "https://", "<link", " src="):
            self.assertNotIn(external, page.text.replace('"http://www.w3.org/2000/svg"', ""))

    def chromium(self, *args):
        """Runs headless Chromium on the dashboard (virtual time: its polls run at once); returns its stderr."""
        run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                              "--no-first-run", "--enable-logging=stderr", "--v=0", "--window-size=1280,1000",
                              "--virtual-time-budget=4000", *args, self.server.url + "/dashboard"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertNotIn("Uncaught", run.stderr)
        return run

    @unittest.skipIf(CHROMIUM is None, "Debian's chromium is not installed (tools/setup installs it): "
                                       "the page is not loaded in a browser")
    def test_page_in_chromium(self):
        dom = self.chromium("--dump-dom").stdout
        elements = Elements(dom).elements
        body = next(attrs for tag, attrs in elements if tag == "body")
        self.assertNotIn("data-error", body, body)
        self.assertGreater(int(body.get("data-samples", 0)), 0, "the page drew no sample")
        charts = [attrs for tag, attrs in elements if tag == "svg" and attrs.get("class") == "chart"]
        self.assertEqual(len(charts), len(CHARTS))
        paths = [attrs for tag, attrs in elements if tag == "path" and attrs.get("class") == "series"]
        self.assertEqual(len(paths), sum(CHARTS.values()))
        # The throughput lines have points (the requests' tokens).
        generated = next(p for p in paths if p["data-series"] == "generated")
        self.assertRegex(generated["d"], r"^M[\d.]+,[\d.]+")
        self.assertEqual(len([a for t, a in elements if a.get("class") == "tile"]), 8)

        os.makedirs(ARTIFACTS, exist_ok=True)
        shot = os.path.join(ARTIFACTS, "dashboard.png")
        if os.path.exists(shot):
            os.remove(shot)
        self.chromium(f"--screenshot={shot}")
        width, height, rows = read_png(shot)
        print(f"\nscreenshot of the dashboard: {shot} ({width}×{height})")
        self.assertEqual((width, height), (1280, 1000))
        colours = {p for row in rows for p in row}
        self.assertGreater(len(colours), 50, "the screenshot is nearly blank")
        # The legends' swatches: the charts' first three colours (dashboard.html's COLORS).
        for hex_colour in ("2563eb", "f59e0b", "dc2626"):
            self.assertIn(tuple(bytes.fromhex(hex_colour)), colours, hex_colour)


if __name__ == "__main__":
    unittest.main()
