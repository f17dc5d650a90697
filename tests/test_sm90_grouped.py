"""The sm90 walks over grouped rows and over a list of problems (templates/sm90/gemm_kernel.cuh, GroupedRows and
ProblemList), checked on the host: the structs compiled by nvcc into small host programs (CPU only, no GPU).

What the kernel relies on, for any group ends (sorted or not) and any persistent grid: the units of all groups,
walked by each cluster in its stride (units only increase), cover every (group, block of rows, column block)
exactly once; a unit's rows lie inside its group's rows and inside [0, m); empty groups have no unit; ends that
decrease or pass m are clamped (rows outside every group belong to no unit); masked groups (a slab of rows per
group, GemmArgs::group_rows) walk each slab's first count rows, counts clamped into the slab. A list's walk likewise: every
(problem, unit of the problem) exactly once, with that problem's sizes, empty problems never.
"""
from __future__ import annotations

import pytest

from test_nvcc_compile import NO_NVCC, NVCC, run_host_program

PROGRAM = r"""
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>
#include "sm90/gemm_kernel.cuh"

using gemmgen::sm90::GroupedRows;
static int failures = 0;
#define CHECK(cond, ...) \
  do { if (!(cond) && failures++ < 10) { std::printf(__VA_ARGS__); std::printf("\n"); } } while (0)

// ends: the groups' ends as given (slab > 0: their row counts, each group in rows [g * slab, (g + 1) * slab));
// m: A's rows; rows_per_unit: a cluster's rows; units_n; clusters: the grid.
void check(const std::vector<int32_t>& ends, int m, int rows_per_unit, int units_n, int clusters, int slab = 0) {
  const GroupedRows rows{ends.data(), static_cast<int>(ends.size()), m, rows_per_unit, units_n, slab};
  // The expected blocks: each group's clamped rows in blocks of rows_per_unit, times units_n.
  std::map<std::tuple<int, int, int>, int> expected;  // (group, first row, column block) -> times seen
  int row0 = 0;
  for (int g = 0; g < static_cast<int>(ends.size()); ++g) {
    int e;
    if (slab > 0) {  // the slab's first count rows, the count clamped into [0, slab]
      row0 = g * slab;
      e = row0 + (ends[g] < 0 ? 0 : ends[g] > slab ? slab : ends[g]);
      CHECK(e <= m, "slab %d: group %d ends at %d past m=%d", slab, g, e, m);
    } else {
      e = ends[g] < row0 ? row0 : ends[g] > m ? m : ends[g];
    }
    for (int r = row0; r < e; r += rows_per_unit)
      for (int n = 0; n < units_n; ++n) expected[{g, r, n}] = 0;
    row0 = e;
  }
  const int units = rows.units();
  CHECK(units == static_cast<int>(expected.size()), "m=%d: %d units counted, %zu blocks", m, units, expected.size());
  for (int c = 0; c < clusters; ++c) {
    GroupedRows::Walk walk;
    for (int unit = c; unit < units; unit += clusters) {
      walk.seek(rows, unit);
      const int local = unit - walk.first_unit;
      CHECK(local >= 0 && local < walk.units, "m=%d: unit %d outside its group %d's units", m, unit, walk.group);
      const int first_row = walk.row0 + (local % walk.units_m) * rows_per_unit;  // (any raster: here along M)
      const int n = local / walk.units_m;
      CHECK(first_row >= walk.row0 && first_row < walk.row_end && walk.row_end <= m, "m=%d: unit %d rows %d.. outside "
            "group %d [%d, %d)", m, unit, first_row, walk.group, walk.row0, walk.row_end);
      auto it = expected.find({walk.group, first_row, n});
      CHECK(it != expected.end(), "m=%d: unit %d is no block (group %d, row %d, n %d)", m, unit, walk.group,
            first_row, n);
      if (it != expected.end()) ++it->second;
    }
  }
  for (const auto& [key, seen] : expected)
    CHECK(seen == 1, "m=%d: block (group %d, row %d, n %d) walked %d times", m, std::get<0>(key), std::get<1>(key),
          std::get<2>(key), seen);
}

int main() {
  // Mixture-of-experts shapes: 8 experts of 2048 tokens in 2x1 clusters of 128-row tiles, 132 SMs.
  std::vector<int32_t> ends8;
  for (int g = 1; g <= 8; ++g) ends8.push_back(2048 * g);
  check(ends8, 8 * 2048, 256, 56, 66);
  // Ragged and empty groups, empty first and last, one group, all empty.
  check({0, 1, 128, 257, 257, 700, 705, 705}, 705, 128, 3, 7);
  check({0, 0, 300}, 300, 128, 2, 132);
  check({300}, 300, 256, 1, 1);
  check({0, 0, 0}, 0, 128, 4, 5);
  // Bad ends: decreasing, past m, negative: clamped, never outside [0, m).
  check({100, 50, 400, -3, 200}, 300, 128, 2, 3);
  check({-5, 64}, 64, 64, 1, 2);
  for (int clusters = 1; clusters <= 9; ++clusters)
    for (int per = 1; per <= 130; per += 43) check({per, 2 * per, 2 * per, 5 * per}, 5 * per, 64, 3, clusters);
  // Many groups, a count no multiple of 8: a decode step's experts (most empty, some of one row), and a skewed
  // routing with a decreasing end far in.
  for (int groups : {7, 8, 9, 17, 37, 130}) {
    std::vector<int32_t> few, skewed;
    int end = 0;
    for (int g = 0; g < groups; ++g) {
      few.push_back(end += (g * 7) % 5 == 0 ? 1 : 0);
      skewed.push_back(g == 20 ? 3 : g * g % 301 + g * 40);
    }
    for (int clusters : {1, 2, 5, 66, 132}) {
      check(few, end, 64, 12, clusters);
      check(skewed, skewed.back() - 50, 128, 2, clusters);
      check(few, groups * 4, 128, 3, clusters, 4);  // masked: counts of 0 and 1 in slabs of 4
    }
  }
  // Masked slabs (GemmArgs::group_rows): counts, each group at its slab's first row; full, partial, empty slabs,
  // counts past the slab or negative (clamped into it), slabs not a multiple of the unit's rows.
  check({256, 100, 0, 1, 256}, 5 * 256, 128, 3, 7, 256);
  check({300, -4, 77, 0}, 4 * 160, 64, 2, 5, 160);
  check({0, 0, 0}, 3 * 64, 128, 4, 3, 64);
  check({1, 1, 1, 1, 1, 1, 1, 1}, 8 * 8, 256, 56, 66, 8);
  for (int clusters = 1; clusters <= 6; ++clusters) check({17, 200, 129, 128}, 4 * 200, 128, 2, clusters, 200);
  std::printf("%d failures\n", failures);
  return failures != 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_grouped_rows_walk(tmp_path) -> None:
    assert run_host_program(PROGRAM, tmp_path).strip() == "0 failures"


LIST_PROGRAM = r"""
#include <cstdio>
#include <vector>
#include "sm90/gemm_kernel.cuh"

using gemmgen::sm90::ListProblem;
using gemmgen::sm90::ProblemList;
static int failures = 0;
#define CHECK(cond, ...) \
  do { if (!(cond) && failures++ < 10) { std::printf(__VA_ARGS__); std::printf("\n"); } } while (0)

// sizes: (m, n, k) per problem; tiles of bm x bn, k tiles of bk; clusters: the grid.
void check(const std::vector<std::vector<int>>& sizes, int bm, int bn, int bk, int clusters) {
  std::vector<ListProblem> table(sizes.size());
  std::vector<std::vector<int>> seen(sizes.size());
  int units = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {  // as the launch's list_entry sizes them
    ListProblem& e = table[i];
    e.m = sizes[i][0], e.n = sizes[i][1], e.k_tiles = (sizes[i][2] + bk - 1) / bk;
    e.first_unit = units;
    e.units_m = e.m > 0 && e.n > 0 ? (e.m + bm - 1) / bm : 0;
    e.units_n = e.m > 0 && e.n > 0 ? (e.n + bn - 1) / bn : 0;
    units += e.units_m * e.units_n;
    seen[i].assign(e.units_m * e.units_n, 0);
  }
  const ProblemList list{table.data(), static_cast<int>(table.size())};
  CHECK(list.units() == units, "%d units counted, %d in the table", list.units(), units);
  for (int c = 0; c < clusters; ++c) {
    ProblemList::Walk walk;
    for (int unit = c; unit < list.units(); unit += clusters) {
      walk.seek(list, unit);
      const int i = walk.problem, local = unit - walk.first_unit;
      CHECK(i >= 0 && i < static_cast<int>(sizes.size()) && local >= 0 && local < walk.units,
            "unit %d outside problem %d's units", unit, i);
      if (!(i >= 0 && i < static_cast<int>(sizes.size()) && local >= 0 && local < walk.units)) continue;
      CHECK(walk.m == sizes[i][0] && walk.n == sizes[i][1] && walk.k_tiles == table[i].k_tiles,
            "unit %d: problem %d's sizes %d x %d (%d k tiles) walked as %d x %d (%d)", unit, i, sizes[i][0],
            sizes[i][1], table[i].k_tiles, walk.m, walk.n, walk.k_tiles);
      ++seen[i][local];
    }
  }
  for (size_t i = 0; i < seen.size(); ++i)
    for (size_t u = 0; u < seen[i].size(); ++u)
      CHECK(seen[i][u] == 1, "problem %zu unit %zu walked %d times", i, u, seen[i][u]);
}

int main() {
  check({{2048, 2048, 2048}}, 128, 256, 64, 66);
  // Ragged sizes with empty problems first, between and last; K = 0 has units (D = 0), M or N = 0 none.
  check({{0, 64, 64}, {1, 7, 63}, {129, 300, 1000}, {64, 0, 5}, {300, 129, 0}, {1000, 1, 7}, {0, 0, 0}}, 128, 128,
        64, 5);
  check({{0, 0, 0}, {0, 3, 3}}, 128, 128, 64, 3);
  for (int clusters = 1; clusters <= 9; ++clusters)
    check({{17, 300, 64}, {300, 17, 128}, {1, 1, 1}, {511, 513, 64}}, 64, 256, 64, clusters);
  std::printf("%d failures\n", failures);
  return failures != 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_problem_list_walk(tmp_path) -> None:
    assert run_host_program(LIST_PROGRAM, tmp_path).strip() == "0 failures"
