"""benchmarks/grounding.py runs and reports what it claims (neurovec's side only: NeuraLogic takes minutes)."""
import time

from neurovec.benchmarks import grounding


def test_grounding_benchmark_reports_both_sides(tu_dir, mutagenesis_dir, capsys):
    results = grounding.main(["--data", str(tu_dir.parent), "--no-neuralogic", "--repeats", "1", "--seconds", "0",
                              "--jobs", "MUTAG", "mutagenesis"])
    printed = capsys.readouterr().out
    mutag, mutagenesis = results["jobs"]["MUTAG GCN (188 graphs)"], results["jobs"]["Mutagenesis (SQLite)"]
    assert mutag["groundings"] == 24997 and mutagenesis["groundings"] > 40000
    assert "| MUTAG GCN (188 graphs) | not run |" in printed
    assert "| Mutagenesis (from arrays) | not run |" in printed
    assert "| Mutagenesis (SQLite, joins in the database) | not run |" in printed
    # the fed-back results round-trip through the report with NeuraLogic's side filled in
    mutagenesis["neuralogic"] = {"finished": True, "seconds": 10.0, "samples": 188}
    mutag["neuralogic"] = {"finished": False, "waited": 5.0}
    text = grounding.report(results)
    assert f"did not finish in {results['timeout']:.0f} s" in text
    arrays, sql = mutagenesis["arrays"][0], mutagenesis["neurovec"][0]
    assert f"| 10.00 s | {grounding._seconds(mutagenesis['arrays'])} | {10 / arrays:.0f}x |" in text
    assert f"| 10.00 s | {grounding._seconds(mutagenesis['neurovec'])} | {10 / sql:.0f}x |" in text


def test_short_jobs_are_timed_in_more_rounds_interleaved():
    calls = []

    def step(name):
        return lambda: (calls.append(name), time.sleep(0.002))

    assert [len(t) for t in grounding._timed(step("a"), 2, step("b"))] == [2, 2]
    assert calls == ["a", "b", "b", "a"]  # each in turn starts a round
    calls.clear()
    a, b = grounding._timed(step("a"), 2, step("b"), seconds=0.05)
    # rounds go on until they have taken the 0.05 s (sleeps overshoot on a loaded machine: count, do not guess)
    assert len(a) == len(b) > 2 and calls[:4] == ["a", "b", "b", "a"]
    assert sum(a) + sum(b) >= 0.05 > sum(a[:-1]) + sum(b[:-1])


def test_the_ratio_is_the_median_of_each_rounds_ratio():
    # a slow phase of the machine (rounds 2 and 3) slows both sides of a round: the ratio of medians moves, this not
    assert grounding._paired_ratio([1.0, 5.0, 5.0, 1.0], [0.5, 4.0, 4.0, 0.5]) == (1.25 + 2.0) / 2
