"""The sm90 stream-K partition (templates/sm90/gemm_kernel.cuh, StreamK), checked on the host: the
struct compiled by nvcc into a small host program (CPU only, no GPU).

What the kernel relies on, for every problem size and grid (the launch starts at most units x k_tiles clusters;
with fewer units than clusters every unit is cut): whole units (in waves) and the shares of the
cut tail cover each (work unit, k tile) iteration exactly once; no share of a cut tail is empty; a unit
cut between clusters has exactly one owner (the cluster with its k = 0 iteration, for which it is the
last segment) and its other parts are the first segments of the clusters the owner waits for (those
whose share begins inside the unit), so no owner waits for a part queued behind its own work.
"""
from __future__ import annotations

import pytest


from generator.planner.sm90 import split_parts
from test_nvcc_compile import NO_NVCC, NVCC, run_host_program

PROGRAM = r"""
#include <cstdio>
#include <vector>
#include "sm90/gemm_kernel.cuh"

using gemmgen::sm90::StreamK;
static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond) && failures++ < 10) { std::printf(__VA_ARGS__); std::printf("\n"); } } while (0)

void check(int units, int k_tiles, int clusters) {
  const StreamK sk(units, k_tiles, clusters);
  std::vector<int> covered(static_cast<size_t>(units) * k_tiles, 0);
  std::vector<int> owner(units, -1);
  std::vector<std::vector<int>> parts(units);  // clusters holding a part of each unit (other than its owner)
  std::vector<int> whole(clusters, 0);
  for (int c = 0; c < clusters; ++c) {
    for (int w = 0; sk.whole_unit(c, w) >= 0; ++w, ++whole[c]) {
      const int u = sk.whole_unit(c, w);
      CHECK(u == c + w * clusters, "U=%d K=%d G=%d: wave %d of cluster %d is unit %d", units, k_tiles, clusters, w, c, u);
      for (int kt = 0; kt < k_tiles; ++kt) ++covered[static_cast<size_t>(u) * k_tiles + kt];
    }
    const int64_t begin = sk.share_begin(c), end = sk.share_begin(c + 1);
    const bool has_tail = sk.tail_begin < static_cast<int64_t>(units) * k_tiles;
    CHECK(!has_tail || begin < end, "U=%d K=%d G=%d: cluster %d has an empty share of the tail", units, k_tiles,
          clusters, c);
    int segment = 0;
    for (int64_t it = begin; it < end; ++segment) {
      const StreamK::Segment s = sk.segment(it, end);
      CHECK(s.kt_begin < s.kt_end && s.kt_end <= k_tiles, "U=%d K=%d G=%d: bad segment", units, k_tiles, clusters);
      for (int kt = s.kt_begin; kt < s.kt_end; ++kt) ++covered[static_cast<size_t>(s.unit) * k_tiles + kt];
      it += s.kt_end - s.kt_begin;
      const bool last = it == end;
      if (s.kt_begin > 0) {  // a contributor: only ever the share's first segment
        CHECK(segment == 0, "U=%d K=%d G=%d: cluster %d contributes to unit %d mid-share", units, k_tiles, clusters, c, s.unit);
        parts[s.unit].push_back(c);
      } else if (s.kt_end < k_tiles) {  // the owner of a cut unit: only ever the share's last segment
        CHECK(last, "U=%d K=%d G=%d: cluster %d owns unit %d mid-share", units, k_tiles, clusters, c, s.unit);
        CHECK(owner[s.unit] < 0, "U=%d K=%d G=%d: unit %d has two owners", units, k_tiles, clusters, s.unit);
        owner[s.unit] = c;
      }
    }
  }
  for (size_t i = 0; i < covered.size(); ++i)
    CHECK(covered[i] == 1, "U=%d K=%d G=%d: iteration %zu covered %d times", units, k_tiles, clusters, i, covered[i]);
  // whole units first, in waves: every cluster has as many, or one fewer when the tail is not cut
  for (int c = 1; c < clusters; ++c)
    CHECK(whole[c] <= whole[0] && whole[c] >= whole[0] - 1, "U=%d K=%d G=%d: cluster %d has %d whole units, cluster 0 %d",
          units, k_tiles, clusters, c, whole[c], whole[0]);
  for (int u = 0; u < units; ++u) {
    if (parts[u].empty()) continue;
    CHECK(owner[u] >= 0, "U=%d K=%d G=%d: unit %d is cut but has no owner", units, k_tiles, clusters, u);
    // the owner's rule (consume_stream_k): clusters after it whose share begins inside the unit
    std::vector<int> waited;
    for (int c = owner[u] + 1; c < clusters && sk.begins_inside(c, u); ++c) waited.push_back(c);
    CHECK(waited == parts[u], "U=%d K=%d G=%d: unit %d: the owner waits for %zu clusters, %zu hold parts", units,
          k_tiles, clusters, u, waited.size(), parts[u].size());
  }
}

int main() {
  // The 4096^3 and 8192^3 kernels (128x256, cluster 2x1: 66 clusters), then small and lopsided grids.
  check(256, 64, 66);
  check(1024, 128, 66);
  const StreamK square(256, 64, 66);  // 3 whole waves (198 units), the last 58 units cut into 66 shares
  CHECK(square.whole_waves == 3 && square.tail_begin == 198 * 64, "4096^3: %d whole waves, tail at %lld",
        square.whole_waves, static_cast<long long>(square.tail_begin));
  check(1, 1, 1);
  check(1, 7, 7);
  check(3, 5, 15);
  // Fewer units than clusters (a small M: 128x4096 in 128x64 tiles, 32 or 64 k tiles, 132 clusters of one
  // block): every unit is cut, no whole waves, each unit's k tiles split among consecutive clusters.
  check(64, 32, 132);
  check(64, 64, 132);
  check(16, 64, 132);
  const StreamK small(64, 32, 132);
  CHECK(small.whole_waves == 0 && small.tail_begin == 0, "128x4096x4096: %d whole waves, tail at %lld",
        small.whole_waves, static_cast<long long>(small.tail_begin));
  // The launch's split-K grid for fewer units than clusters: units x parts clusters (512x4096x14336 in 128x256
  // tiles: 64 units of 224 k tiles, 2 parts), each unit cut at the same k tiles, so that the clusters sharing a
  // B tile read the same k range together.
  for (const int parts : {2, 3, 4}) {
    check(64, 224, 64 * parts);
    const StreamK split(64, 224, 64 * parts);
    for (int c = 0; c < 64 * parts; ++c)
      split.for_each_segment(c, [&](const StreamK::Segment& s) {
        CHECK(s.kt_begin == 224 * (c % parts) / parts && s.kt_end == 224 * (c % parts + 1) / parts &&
                  s.unit == c / parts,
              "split-K in %d parts: cluster %d has unit %d k tiles [%d, %d)", parts, c, s.unit, s.kt_begin, s.kt_end);
      });
  }
  for (int units = 1; units <= 12; ++units)
    for (int k_tiles = 1; k_tiles <= 9; ++k_tiles)
      for (int clusters = 1; clusters <= units * k_tiles && clusters <= 40; ++clusters) check(units, k_tiles, clusters);
  std::printf("%d failures\n", failures);
  return failures != 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_stream_k_partition(tmp_path) -> None:
    assert run_host_program(PROGRAM, tmp_path).strip() == "0 failures"


FLAGS_PROGRAM = r"""
#include <climits>
#include <cstdio>
#include "common/workspace.cuh"

using gemmgen::StreamKFlags;
using gemmgen::kStreamKMinFlags;
static int failures = 0;
#define CHECK(cond) do { if (!(cond) && failures++ < 10) std::printf("failed: %s\n", #cond); } while (0)

// stream_k_flags' bookkeeping, without the GPU: replace and zero as the entry says, then take the next epoch.
static int take(StreamKFlags& e, size_t needed) {
  if (e.needs_zeroing(needed)) {
    if (const size_t grown = e.replacement(needed); grown > 0) e.slots = grown;
    e.epoch = 0;
  }
  return ++e.epoch;
}

int main() {
  StreamKFlags e;
  CHECK(e.needs_zeroing(264) && e.replacement(264) == kStreamKMinFlags);   // a stream's first launch
  CHECK(take(e, 264) == 1 && e.slots == kStreamKMinFlags);
  CHECK(!e.needs_zeroing(264) && e.replacement(264) == 0);
  CHECK(take(e, 100) == 2 && take(e, kStreamKMinFlags) == 3);              // kept: every epoch new
  CHECK(e.replacement(kStreamKMinFlags + 1) == kStreamKMinFlags + 1);      // a larger grid: new flags, zeroed
  CHECK(take(e, kStreamKMinFlags + 1) == 1 && e.slots == kStreamKMinFlags + 1);
  e.epoch = INT_MAX - 1;                                                    // the epochs about to wrap
  CHECK(take(e, 264) == INT_MAX);
  CHECK(e.needs_zeroing(264) && e.replacement(264) == 0);                   // zeroed in place, epochs from 1 again
  CHECK(take(e, 264) == 1 && e.slots == kStreamKMinFlags + 1);
  std::printf("%d failures\n", failures);
  return failures != 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_stream_k_flags_take_a_new_epoch_every_launch(tmp_path) -> None:
    """The flags a stream keeps (common/workspace.cuh StreamKFlags): a launch never takes an epoch its flags may hold
    (each epoch once between zeroings; zeroed when new, replaced for a larger grid, and before the epochs wrap)."""
    assert run_host_program(FLAGS_PROGRAM, tmp_path).strip() == "0 failures"


PARTS_PROGRAM = r"""
#include <cstdio>
#include "sm90/gemm_kernel.cuh"
#include "sm90/launch.cuh"

int main() {
  for (int fit = 1; fit <= 20; ++fit)
    for (int k_tiles = 1; k_tiles <= 400; k_tiles += 3)
      std::printf("%d %d %lld\n", fit, k_tiles, static_cast<long long>(gemmgen::sm90::split_k_parts(fit, k_tiles)));
  return 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_split_parts_are_the_launchs(tmp_path) -> None:
    """The planner describes and costs a split with the parts the launch cuts (planner split_parts, launch.cuh
    split_k_parts): the same for every fit and k tile count."""
    rows = [tuple(map(int, line.split())) for line in run_host_program(PARTS_PROGRAM, tmp_path).splitlines()]
    assert len(rows) == 20 * len(range(1, 401, 3))
    for fit, k_tiles, parts in rows:
        assert parts == split_parts(fit, k_tiles), (fit, k_tiles)
        assert 1 <= parts <= min(fit, k_tiles)
