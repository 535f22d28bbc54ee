"""`dsv4 bench --plot FILE.svg` on the shipped tiny model on the CPU: the picture is well-formed SVG with one mark per
decode row (its context, batch, percentage of the floor, and the floor below the bar exactly when the row is slower
than it) and one per prefill length, as the run's JSON says; an unwritable path fails before the run.

Run by ctest (tests/CMakeLists.txt), the standard library only:
    DSV4_CLI=build/bin/dsv4 python3 -m unittest -v tests/e2e/test_bench_plot.py
"""

import json
import os
import subprocess
import tempfile
import unittest
import xml.etree.ElementTree as ET

DSV4 = os.environ.get("DSV4_CLI", os.path.join(os.path.dirname(__file__), "../../build/bin/dsv4"))
NS = {"svg": "http://www.w3.org/2000/svg"}


def label(v):
    """bench_plot.cpp's labels: three significant digits, whole numbers from 1000 on."""
    return "%.0f" % v if abs(v) >= 1000 else "%.3g" % v


class TestBenchPlot(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        svg, js = os.path.join(cls.tmp.name, "bench.svg"), os.path.join(cls.tmp.name, "bench.json")
        run = subprocess.run([DSV4, "bench", "--backend", "cpu", "--prefill", "16,24", "--contexts", "0,40",
                              "--batches", "1,2", "--reps", "2", "--decode-steps", "2", "--json", js, "--plot", svg],
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        with open(js) as f:
            cls.report = json.load(f)
        cls.root = ET.parse(svg).getroot()  # raises on XML that is not well-formed

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def groups(self, kind):
        return [g for g in self.root.iter("{%s}g" % NS["svg"]) if g.get("class") == kind]

    def texts(self, element, kind):
        return [t.text for t in element.iter("{%s}text" % NS["svg"]) if t.get("class") == kind]

    def test_one_mark_per_decode_row(self):
        rows = self.report["decode"]
        marks = self.groups("decode-row")
        self.assertEqual(len(marks), len(rows))
        for row, mark in zip(rows, marks):
            where = (int(mark.get("data-context")), int(mark.get("data-batch")))
            self.assertEqual(where, (row["context"], row["batch"]))
            self.assertEqual(self.texts(mark, "achieved"), [label(row["achieved"] * 100) + "%"])
            self.assertEqual(self.texts(mark, "batch"), [str(row["batch"])])
            bar = mark.find("svg:rect[@class='measured']", NS)
            floor = mark.find("svg:line[@class='floor']", NS)
            self.assertIsNotNone(bar)
            self.assertIsNotNone(floor)
            self.assertGreater(float(bar.get("height")), 0)
            # Slower than the floor: the bar reaches above the floor line (SVG's y grows downwards).
            self.assertEqual(float(bar.get("y")) < float(floor.get("y1")), row["achieved"] < 1, row)
            self.assertIn("of the floor", mark.find("svg:title", NS).text)
        # Bars of the same batch share a colour, different batches differ.
        colours = {}
        for mark in marks:
            colours.setdefault(mark.get("data-batch"), set()).add(mark.find("svg:rect", NS).get("fill"))
        self.assertEqual([len(c) for c in colours.values()], [1, 1])
        self.assertEqual(len(set.union(*colours.values())), 2)
        self.assertEqual(self.texts(self.root, "context"), ["context 0", "context 40"])

    def test_one_mark_per_prefill_length(self):
        marks = self.groups("prefill-row")
        self.assertEqual([int(m.get("data-tokens")) for m in marks], [p["tokens"] for p in self.report["prefill"]])
        for row, mark in zip(self.report["prefill"], marks):
            self.assertEqual(self.texts(mark, "achieved"), [label(row["tokens_per_s"]["mean"])])

    def test_title_names_the_run(self):
        title = self.texts(self.root, "title")
        self.assertEqual(title, ["dsv4 bench: tiny"])
        subtitle = " ".join(self.texts(self.root, "subtitle"))
        self.assertIn("cpu on", subtitle)
        self.assertIn("numerics " + self.report["numerics"], subtitle)
        self.assertIn("copy bandwidth", subtitle)

    def test_unwritable_path_fails_before_the_run(self):
        run = subprocess.run([DSV4, "bench", "--backend", "cpu", "--plot", "/nonexistent/dir/bench.svg"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 1)
        self.assertIn("/nonexistent/dir/bench.svg: cannot write", run.stderr)
        self.assertNotIn("bench: loaded", run.stderr)  # the model was not even loaded


if __name__ == "__main__":
    unittest.main()
