#!/usr/bin/env python3
"""The docs' figure check and the results files' provenance check, each shown
to catch what it exists to catch (CTest docs_figures_test): a changed figure, a
figure without its field, a stale mapping, history on a user page, a results
file without its date, commit, dirty flag or machine."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docs_figures as f  # noqa: E402
import machine  # noqa: E402

RESULTS = {
    "a.json": {"runs": [{"ranks": 1, "ms": 12.06, "peer_ms": 24.08, "name": "x y"},
                        {"ranks": 2, "ms": 6.5, "peer_ms": 13.4, "name": "z"}],
               "odd key": {"v": 3.25}, "ratios": [1.104, 1.336]},
    "b.json": {"mib": 50.6},
}


def problems(text, user_page=True):
    cache = dict(RESULTS)
    return f.check_block("page.md:1", text.strip("\n").split("\n"), user_page, cache)


class Figures(unittest.TestCase):
    def test_a_mapped_figure_that_agrees_passes(self):
        self.assertEqual(problems("""
<!-- source: a.json
  12.06 ms = runs[ranks=1].ms
  2.00x = runs[ranks=1].peer_ms / runs[ranks=1].ms
-->
DDP takes 12.06 ms, 2.00x faster than PyTorch."""), [])

    def test_a_changed_figure_fails(self):
        got = problems("""
<!-- source: a.json
  34.86 ms = runs[ranks=1].ms
-->
DDP takes 34.86 ms.""")
        self.assertEqual(len(got), 1)
        self.assertIn("34.86 ms is not what a.json says", got[0])
        self.assertIn("12.06", got[0])

    def test_rounding_follows_the_printed_decimals(self):
        self.assertTrue(f.agrees("12.1 ms", 12.06))
        self.assertFalse(f.agrees("12.0 ms", 12.06))
        self.assertTrue(f.agrees("12 ms", 12.4))
        self.assertFalse(f.agrees("13 ms", 12.4))
        self.assertTrue(f.agrees("-1.9%", -1.86))
        self.assertFalse(f.agrees("1.9%", -1.86))
        self.assertTrue(f.agrees("1,234 ms", 1234.2))

    def test_a_figure_without_its_field_fails(self):
        got = problems("""
<!-- source: a.json
  12.06 ms = runs[ranks=1].ms
-->
DDP takes 12.06 ms and FSDP 14.2 ms.""")
        self.assertEqual(len(got), 1)
        self.assertIn("14.2 ms: give it a line", got[0])

    def test_a_mapping_the_text_no_longer_prints_fails(self):
        got = problems("""
<!-- source: a.json
  12.06 ms = runs[ranks=1].ms
  6.5 ms = runs[ranks=2].ms
-->
DDP takes 12.06 ms.""")
        self.assertEqual(len(got), 1)
        self.assertIn("no longer prints", got[0])

    def test_settings_listed_beside_fields(self):
        self.assertEqual(problems("""
<!-- source: a.json, setting
  12.06 ms = runs[ranks=1].ms
  setting: 64 MiB 1.2x
-->
With 64 MiB buckets DDP takes 12.06 ms; the goal is 1.2x."""), [])

    def test_figures_without_any_source_fail(self):
        got = problems("DDP takes 12.06 ms.")
        self.assertEqual(len(got), 1)
        self.assertIn("without a source", got[0])

    def test_history_only_on_maintainers_pages(self):
        text = """
<!-- source: history -->
On 2026-11-20 it took 40 ms."""
        self.assertEqual(len(problems(text, user_page=True)), 1)
        self.assertEqual(problems(text, user_page=False), [])

    def test_ranges_selectors_functions_and_files(self):
        self.assertEqual(problems("""
<!-- source: a.json, b.json
  1.10-1.34x = min(a.json:ratios), max(a.json:ratios)
  3.25 ms = a.json:["odd key"].v
  6.5 ms = a.json:runs[-1].ms
  9.3 ms = mean(a.json:runs[*].ms)
  50.6 MiB = b.json:mib
-->
Ratios 1.10-1.34x; 3.25 ms; 6.5 ms; a mean of 9.3 ms; 50.6 MiB."""), [])

    def test_selector_by_a_string_field(self):
        self.assertEqual(problems("""
<!-- source: a.json
  13.4 ms = runs[name=z].peer_ms
-->
PyTorch: 13.4 ms."""), [])

    def test_a_path_that_does_not_exist_is_named(self):
        got = problems("""
<!-- source: a.json
  12.06 ms = runs[ranks=4].ms
-->
DDP takes 12.06 ms.""")
        self.assertEqual(len(got), 1)
        self.assertIn("no element with ranks=4", got[0])

    def test_hand_written_table_cells_under_a_unit_are_figures(self):
        table = """
<!-- source: a.json
  12.06 ms = runs[ranks=1].ms
-->
| strategy | step ms | note |
|---|---:|---|
| ddp | 12.06 | 7 |
| fsdp | 34.86 | 8 |"""
        got = problems(table)
        self.assertEqual(len(got), 1)
        self.assertIn("34.86 ms", got[0])

    def test_expressions_refuse_what_is_not_arithmetic(self):
        with self.assertRaises(f.ExpressionError):
            f.evaluate("__import__('os')", RESULTS, "a.json")
        with self.assertRaises(f.ExpressionError):
            f.evaluate("runs[*].ms + 1", RESULTS, "a.json")


class Provenance(unittest.TestCase):
    GOOD = {"date": "2026-11-29", "commit": "abcdef1", "dirty": False,
            "machine": {"cpu": "x", "cores": 2, "gpu": "none"}}

    class AnyHistory:
        def has(self, sha):
            return sha != "deadbee"

    def check(self, data):
        return machine.provenance_problems("x.json", data, self.AnyHistory())

    def test_a_complete_record_passes(self):
        self.assertEqual(self.check(dict(self.GOOD)), [])

    def test_each_missing_field_is_named(self):
        for key, words in (("date", "'date'"), ("commit", "no 'commit'"), ("dirty", "no 'dirty'"),
                           ("machine", "no 'machine'")):
            data = {k: v for k, v in self.GOOD.items() if k != key}
            got = self.check(data)
            self.assertTrue(any(words in p for p in got), (key, got))

    def test_a_commit_outside_the_history_fails_at_any_depth(self):
        got = self.check(dict(self.GOOD, runs=[{"commit": "deadbee"}]))
        self.assertEqual(len(got), 1)
        self.assertIn("runs[0]", got[0])
        self.assertIn("before 2026", self.check(dict(self.GOOD, commit="before 2026"))[0])

    def test_a_gpu_needs_its_driver(self):
        got = self.check(dict(self.GOOD, machine={"cpu": "x", "cores": 16, "gpu": "1 x H100"}))
        self.assertEqual(len(got), 1)
        self.assertIn("driver", got[0])

    def test_unknown_dirty_only_with_a_note(self):
        self.assertEqual(len(self.check(dict(self.GOOD, dirty=None))), 1)
        self.assertEqual(self.check(dict(self.GOOD, dirty=None, provenance_note="not recorded then")), [])


if __name__ == "__main__":
    unittest.main()
