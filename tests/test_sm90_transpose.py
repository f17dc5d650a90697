"""The in-place transpose of tf32 tiles in shared memory (templates/sm90/gemm_kernel.cuh, ChunkTranspose), checked on
the host: the struct compiled by nvcc into a small host program (CPU only, no GPU).

What the kernel relies on (Kernel::transpose_slots, transpose_round): a warp's two rounds move every 4 x 4 block of
a 32 x 32 chunk exactly once, each into its mirror's place, so that the chunk ends up transposed under the same
swizzle; a round's stores reach only blocks that the same round loaded (the warp syncs between a round's loads and
stores, not between rounds); and the eight lanes of each quarter-warp reach eight different 16-byte bank groups at
every load and store, so each access is one shared-memory wavefront.

Beside it, RegisterFragmentA (tf32's M-major A read into wgmma's register fragments instead of transposed,
GEMMGEN_SM90_TF32_A_REGISTERS): the same host program checks both, one compile of the templates for the two tests.
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

static int check_transpose() {
  failures = 0;
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
  return failures;
}
"""


@pytest.fixture(scope="module")
def host_report(tmp_path_factory) -> str:
    """The output of PROGRAM and FRAGMENT_CHECK, compiled into one host program and run."""
    if NVCC is None:
        pytest.skip(NO_NVCC)
    return run_host_program(PROGRAM + FRAGMENT_CHECK, tmp_path_factory.mktemp("sm90_transpose"))


def test_chunk_transpose_moves_every_block_once_without_bank_conflicts(host_report):
    assert "transpose: 0 failures" in host_report, host_report


# -- tf32's M-major A read into registers (GEMMGEN_SM90_TF32_A_REGISTERS) --------------------------------------------

FRAGMENT_CHECK = r"""
using gemmgen::sm90::RegisterFragmentA;

// Where TMA puts element (m, k) of an M-major tf32 tile: chunks of 32 M values (one 128-byte row per k, 32 k rows),
// the 128-byte swizzle applied to the address (bits 4-6 xor bits 7-9), chunks 1024-byte aligned.
static unsigned tma_offset(int m, int k) {
  const unsigned raw = (m / 32) * 4096u + k * 128u + (m % 32) * 4u;
  return raw ^ (((raw >> 7) & 7u) << 4);
}

static int check_fragments() {
  failures = 0;
  for (int m = 0; m < 256; ++m)
    for (int k = 0; k < 32; ++k)
      CHECK(RegisterFragmentA::offset(m, k) == tma_offset(m, k), "(%d, %d): offset %u, TMA writes it at %u", m, k,
            RegisterFragmentA::offset(m, k), tma_offset(m, k));
  for (int base = 0; base < 256; base += 64)   // a warpgroup's m64 block of the tile
    for (int warp = 0; warp < 4; ++warp)
      for (int kk = 0; kk < 4; ++kk) {
        for (int lane = 0; lane < 32; ++lane)
          for (int r = 0; r < 4; ++r) {   // PTX ISA: a0 (row, c), a1 (row + 8, c), a2 (row, c + 4), a3 (row + 8, c + 4)
            const int want_row = 16 * warp + lane / 4 + 8 * (r % 2), want_k = 8 * kk + lane % 4 + 4 * (r / 2);
            const int k = RegisterFragmentA::pass_k(lane, kk, RegisterFragmentA::pass_of(lane, r));
            CHECK(RegisterFragmentA::row(warp, lane, r % 2) == want_row && k == want_k,
                  "warp %d lane %d k step %d a%d: row %d k %d, not row %d k %d", warp, lane, kk, r,
                  RegisterFragmentA::row(warp, lane, r % 2), k, want_row, want_k);
          }
        for (int lane = 0; lane < 32; ++lane)   // a k step is kStepBytes on from the lane's k step 0
          for (int h = 0; h < 2; ++h)
            for (int pass = 0; pass < 2; ++pass) {
              const int m = base + RegisterFragmentA::row(warp, lane, h);
              CHECK(RegisterFragmentA::offset(m, RegisterFragmentA::pass_k(lane, kk, pass)) ==
                        RegisterFragmentA::offset(m, RegisterFragmentA::pass_k(lane, 0, pass)) +
                            kk * RegisterFragmentA::kStepBytes,
                    "row %d lane %d k step %d pass %d: not kStepBytes on from k step 0", m, lane, kk, pass);
            }
        for (int h = 0; h < 2; ++h)
          for (int pass = 0; pass < 2; ++pass) {   // each load of the warp: 32 different banks
            std::set<unsigned> banks;
            for (int lane = 0; lane < 32; ++lane)
              banks.insert((RegisterFragmentA::offset(base + RegisterFragmentA::row(warp, lane, h),
                                                      RegisterFragmentA::pass_k(lane, kk, pass)) / 4) % 32);
            CHECK(banks.size() == 32, "rows %d+, warp %d, k step %d, half %d, pass %d: %zu banks", base, warp, kk, h,
                  pass, banks.size());
          }
      }
  return failures;
}

int main() {   // each check's failures on a line of its own (one host compile of the templates serves both tests)
  const int transpose = check_transpose();
  std::printf("transpose: %d failures\n", transpose);
  const int fragments = check_fragments();
  std::printf("fragments: %d failures\n", fragments);
  return 0;
}
"""


def test_register_fragments_of_an_m_major_a_are_wgmmas_and_conflict_free(host_report):
    """RegisterFragmentA: every register of every lane reads the element PTX ISA's m64nNk8 tf32 fragment puts there,
    from where TMA's 128-byte swizzle wrote it, and each of a warp's loads reaches 32 different banks."""
    assert "fragments: 0 failures" in host_report, host_report
