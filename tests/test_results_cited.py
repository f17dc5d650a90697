"""benchmarks/results/ keeps what the project cites, and everything it cites is there (docs/benchmarking.md, "Keeping
results"). A citation is a results file's name, or its stem (a run's .json and .log go together), in a docs page,
the README, or a comment of the code that reads or explains the numbers; brace lists and globs count
(`h100_corpus_fwd_skip_oob_box32_{a,b}.json`, `h100_corpus_fwd_finer_buckets_beside_old_grid_*.json`)."""
from __future__ import annotations

import fnmatch
import itertools
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: Where citations are read.
CITING = ("docs/**/*.md", "README.md", "generator/**/*.py", "benchmarks/*.py", "gpu/**/*.py", "gpu/*.sh",
          "examples/*.py", "templates/**/*.*")
#: A results name as the files are named: the machine first (h100_, h200_, h200x2_ for two GPUs; cpu2_ for a run
#: without a GPU on 2 cores).
MACHINE = r"(?:h[12]00(?:x\d)?|cpu\d+)_"
NAME = re.compile(MACHINE + r"[\w{},*-]*(?:\.[\w{},*-]+)*")
#: The path form, which must name a file that is there (not `git show REV:benchmarks/results/...`, a file of the past).
PATH = re.compile(r"(?<!:)benchmarks/results/(" + MACHINE + r"[\w{},*-]*(?:\.[\w{},*-]+)*)")


def stem(name: str) -> str:
    return name.split(".", 1)[0]


def expand(text: str) -> list[str]:
    """`a_{x,y}.json` -> [a_x.json, a_y.json] (nested lists too)."""
    brace = re.search(r"\{([^{}]*)\}", text)
    if brace is None:
        return [text]
    return list(itertools.chain.from_iterable(
        expand(text[:brace.start()] + alt + text[brace.end():]) for alt in brace.group(1).split(",")))


@lru_cache(maxsize=1)
def citing_texts() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(errors="replace")
            for pattern in CITING for p in ROOT.glob(pattern) if p.is_file()}


def matching(pattern: str, names: list[str]) -> list[str]:
    return [n for n in names if fnmatch.fnmatch(stem(n), stem(pattern))]


def test_expand_reads_brace_lists():
    assert expand("a_{x,y}_{1,2}.json") == ["a_x_1.json", "a_x_2.json", "a_y_1.json", "a_y_2.json"]
    assert matching("r_*.json", ["r_a.json", "r_a.log", "s_a.json"]) == ["r_a.json", "r_a.log"]


def test_every_results_file_is_cited():
    names = sorted(p.name for p in RESULTS.iterdir())
    cited: set[str] = set()
    for text in citing_texts().values():
        for token in NAME.findall(text):
            for pattern in expand(token.rstrip(".,-")):
                cited.update(matching(pattern, names))
    uncited = [n for n in names if n not in cited]
    assert not uncited, (f"{len(uncited)} file(s) in benchmarks/results/ that no docs page, README or source "
                         f"comment cites: cite each next to what it backs, or delete it: {uncited}")


def test_every_cited_results_path_exists():
    names = sorted(p.name for p in RESULTS.iterdir())
    missing = [(source, pattern) for source, text in citing_texts().items()
               for token in PATH.findall(text) for pattern in expand(token.rstrip(".,-"))
               if not matching(pattern, names)]
    assert not missing, f"cited under benchmarks/results/ but not there (source, name): {missing}"
