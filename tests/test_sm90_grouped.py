"""The sm90 walk over grouped rows (templates/sm90/gemm_kernel.cuh, GroupedRows), checked on the host: the
struct compiled by nvcc into a small host program (CPU only, no GPU).

What the kernel relies on, for any group ends (sorted or not) and any persistent grid: the units of all groups,
walked by each cluster in its stride (units only increase), cover every (group, block of rows, column block)
exactly once; a unit's rows lie inside its group's rows and inside [0, m); empty groups have no unit; ends that
decrease or pass m are clamped (rows outside every group belong to no unit).
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

// ends: the groups' ends as given; m: A's rows; rows_per_unit: a cluster's rows; units_n; clusters: the grid.
void check(const std::vector<int32_t>& ends, int m, int rows_per_unit, int units_n, int clusters) {
  const GroupedRows rows{ends.data(), static_cast<int>(ends.size()), m, rows_per_unit, units_n};
  // The expected blocks: each group's clamped rows in blocks of rows_per_unit, times units_n.
  std::map<std::tuple<int, int, int>, int> expected;  // (group, first row, column block) -> times seen
  int row0 = 0;
  for (int g = 0; g < static_cast<int>(ends.size()); ++g) {
    const int e = ends[g] < row0 ? row0 : ends[g] > m ? m : ends[g];
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
  std::printf("%d failures\n", failures);
  return failures != 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_grouped_rows_walk(tmp_path) -> None:
    assert run_host_program(PROGRAM, tmp_path).strip() == "0 failures"
