"""benchmarks/grounding.py runs and reports what it claims (neurovec's side only: NeuraLogic takes minutes)."""
from neurovec.benchmarks import grounding


def test_grounding_benchmark_reports_both_sides(tu_dir, mutagenesis_dir, capsys):
    results = grounding.main(["--data", str(tu_dir.parent), "--no-neuralogic", "--repeats", "1",
                              "--jobs", "MUTAG", "mutagenesis"])
    printed = capsys.readouterr().out
    mutag, mutagenesis = results["jobs"]["MUTAG GCN (188 graphs)"], results["jobs"]["Mutagenesis (SQLite)"]
    assert mutag["groundings"] == 24997 and mutagenesis["groundings"] > 40000
    assert "| MUTAG GCN (188 graphs) | not run |" in printed
    assert "Mutagenesis from arrays instead of SQL:" in printed and "M groundings/s" in printed
    # the fed-back results round-trip through the report with NeuraLogic's side filled in
    mutagenesis["neuralogic"] = {"finished": True, "seconds": 10.0, "samples": 188}
    mutag["neuralogic"] = {"finished": False, "waited": 5.0}
    text = grounding.report(results)
    assert f"did not finish in {results['timeout']:.0f} s" in text and "x NeuraLogic's time" in text
