"""The in-place transpose of tf32 tiles in shared memory (templates/sm90/gemm_kernel.cuh, ChunkTranspose), checked on
the host: the struct compiled by nvcc into a small host program (CPU only, no GPU).

What the kernel relies on (Kernel::transpose_slots, transpose_round): a warp's two rounds move every 4 x 4 block of
a 32 x 32 chunk exactly once, each into its mirror's place, so that the chunk ends up transposed under the same
swizzle; a round's stores reach only blocks that the same round loaded (the warp syncs between a round's loads and
stores, not between rounds); and the eight lanes of each quarter-warp reach eight different 16-byte bank groups at
every load and store, so each access is one shared-memory wavefront.
"""
from __future__ import annotations

import pytest

from test_nvcc_compile import NO_NVCC, NVCC, run_host_program

PROGRAM = r"""
#include <cstdio>
#include <set>
#include <vector>
#include "sm90/gemm_kernel.cuh"

using gemmgen::sm90::ChunkTranspose;
static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond) && failures++ < 10) { std::printf(__VA_ARGS__); std::printf("\n"); } } while (0)

// Element (r, c) of the chunk: word c % 4 of piece c / 4 of row r.
static int word_of(int r, int c) { return static_cast<int>(ChunkTranspose::piece_offset(r, c / 4) / 4) + c % 4; }

int main() {
  constexpr int N = ChunkTranspose::kRows;
  std::vector<int> smem(N * N, -1);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < N; ++c) smem[word_of(r, c)] = r * N + c;
  std::vector<int> moved(64, 0);
  for (int round = 0; round < ChunkTranspose::kRounds; ++round) {
    std::vector<std::vector<int>> loaded(32);
    std::set<int> loaded_blocks;
    for (int lane = 0; lane < 32; ++lane) {  // every lane's loads, then (after __syncwarp) every lane's stores
      const ChunkTranspose::Block b = ChunkTranspose::block(lane, round);
      CHECK(b.r >= 0 && b.r < 8 && b.c >= 0 && b.c < 8, "round %d lane %d: block (%d, %d)", round, lane, b.r, b.c);
      ++moved[b.r * 8 + b.c];
      loaded_blocks.insert(b.r * 8 + b.c);
      for (int i = 0; i < 4; ++i)
        for (int e = 0; e < 4; ++e) loaded[lane].push_back(smem[word_of(4 * b.r + i, 4 * b.c + e)]);
    }
    for (int lane = 0; lane < 32; ++lane) {
      const ChunkTranspose::Block b = ChunkTranspose::block(lane, round);
      CHECK(loaded_blocks.count(b.c * 8 + b.r), "round %d lane %d: stores into block (%d, %d), loaded in another round",
            round, lane, b.c, b.r);
      for (int j = 0; j < 4; ++j)      // row j of the mirror = column j of the block
        for (int e = 0; e < 4; ++e) smem[word_of(4 * b.c + j, 4 * b.r + e)] = loaded[lane][e * 4 + j];
    }
    for (int q = 0; q < 4; ++q) {      // one wavefront per quarter-warp and access
      for (int i = 0; i < 4; ++i) {
        std::set<int> loads, stores;
        for (int lane = 8 * q; lane < 8 * q + 8; ++lane) {
          const ChunkTranspose::Block b = ChunkTranspose::block(lane, round);
          loads.insert((ChunkTranspose::piece_offset(4 * b.r + i, b.c) >> 4) & 7);
          stores.insert((ChunkTranspose::piece_offset(4 * b.c + i, b.r) >> 4) & 7);
        }
        CHECK(loads.size() == 8 && stores.size() == 8, "round %d quarter %d row %d: %zu / %zu bank groups", round, q,
              i, loads.size(), stores.size());
      }
    }
  }
  for (int blk = 0; blk < 64; ++blk)
    CHECK(moved[blk] == 1, "block (%d, %d) moved %d times", blk / 8, blk % 8, moved[blk]);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < N; ++c)
      CHECK(smem[word_of(r, c)] == c * N + r, "(%d, %d) holds %d, not (%d, %d)", r, c, smem[word_of(r, c)], c, r);
  std::printf("%d failures\n", failures);
  return failures != 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_chunk_transpose_moves_every_block_once_without_bank_conflicts(tmp_path):
    assert run_host_program(PROGRAM, tmp_path).strip().endswith("0 failures")
