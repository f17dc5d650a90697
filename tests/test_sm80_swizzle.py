"""The sm80 family's shared-memory addressing, checked on the host: templates/sm80/gemm_kernel.cuh's
SwizzledTile compiled by nvcc into a small host program (CPU only, no GPU).

The kernels rely on two properties of the swizzle that no GPU test would pin down by itself:
- a shift by whole swizzle periods only adds to the address (load_fragments and TileLoader fold warp,
  mma-tile and k-step offsets into immediates this way), for every tile shape the planner can pick;
- the eight row addresses of one ldmatrix phase, and the chunks one cp.async phase writes, land in
  eight different 16-byte bank groups (no bank conflicts);
- tf32's word tiles (M/N-major operands read by 32-bit loads): every lane's fragment word is the element the
  mma fragment names, the folded addressing equals the plain one, and a warp's 32 words hit 32 banks.
"""
from __future__ import annotations

import pytest

from generator.spec.config import SM80_BLOCK_K, SM80_BLOCK_M, SM80_BLOCK_N, sm80_block_k
from generator.spec.types import DType

from test_nvcc_compile import NO_NVCC, NVCC, run_host_program

# (ROWS, COLS) of every operand tile the sm80 planner allows: K-major tiles are (BM or BN) x BK,
# M/N-major ones BK x (BM or BN).
TILES = sorted({(r, c) for mn in {*SM80_BLOCK_M, *SM80_BLOCK_N} for bk in SM80_BLOCK_K
                for r, c in ((mn, bk), (bk, mn))})
# tf32: K-major tiles (BM or BN) x BK of fp32 (ldmatrix, the bytes of a 16-bit tile with twice the BK), and the
# word tiles BK x (BM or BN) of M/N-major operands.
TF32_K_MAJOR = sorted({(mn, bk) for mn in {*SM80_BLOCK_M, *SM80_BLOCK_N} for bk in sm80_block_k(DType.tf32)})
TF32_WORDS = sorted({(bk, mn) for mn in {*SM80_BLOCK_M, *SM80_BLOCK_N} for bk in sm80_block_k(DType.tf32)})

PROGRAM = r"""
#include <cstdio>
#include "sm80/gemm_kernel.cuh"

using gemmgen::sm80::SwizzledTile;
static int failures = 0;

template <int ROWS, int COLS, int ELEM_BYTES = 2>
void check() {
  using Tile = SwizzledTile<ROWS, COLS, ELEM_BYTES>;
  // A shift by whole periods adds shift * row bytes, whatever the row and chunk.
  for (int shift = 0; shift < ROWS; shift += Tile::kPeriodRows)
    for (int row = 0; row + shift < ROWS; ++row)
      for (int chunk = 0; chunk < Tile::kChunksPerRow; ++chunk)
        if (Tile::offset(row + shift, chunk) != Tile::offset(row, chunk, shift)) {
          if (failures++ < 10)
            std::printf("SwizzledTile<%d,%d>: offset(%d + %d, %d) = %u but offset(%d, %d, %d) = %u\n", ROWS, COLS,
                        row, shift, chunk, Tile::offset(row + shift, chunk), row, chunk, shift,
                        Tile::offset(row, chunk, shift));
        }
  // Eight consecutive rows at one logical chunk (an ldmatrix phase), and eight consecutive chunks of
  // a row-major walk (a cp.async phase), each cover the eight 16-byte bank groups of a 128-byte line.
  for (int row0 = 0; row0 + 8 <= ROWS; row0 += 8)
    for (int chunk = 0; chunk < Tile::kChunksPerRow; ++chunk) {
      unsigned groups = 0;
      for (int r = 0; r < 8; ++r) groups |= 1u << ((Tile::offset(row0 + r, chunk) / 16) % 8);
      if (groups != 0xffu && failures++ < 10)
        std::printf("SwizzledTile<%d,%d>: ldmatrix rows %d..%d chunk %d hit bank groups %#x\n", ROWS, COLS, row0,
                    row0 + 7, chunk, groups);
    }
  for (int first = 0; first + 8 <= ROWS * Tile::kChunksPerRow; first += 8) {
    unsigned groups = 0;
    for (int i = first; i < first + 8; ++i)
      groups |= 1u << ((Tile::offset(i / Tile::kChunksPerRow, i % Tile::kChunksPerRow) / 16) % 8);
    if (groups != 0xffu && failures++ < 10)
      std::printf("SwizzledTile<%d,%d>: copy chunks %d..%d hit bank groups %#x\n", ROWS, COLS, first, first + 7,
                  groups);
  }
}
"""


def run_checks(program: str, checks: list[str], tmp_path) -> str:
    """Compile and run a host program made of ``program`` and a main() that calls ``checks``; its last line."""
    main = "int main() {\n  " + "\n  ".join(checks) + '\n  std::printf("%d failures\\n", failures);\n  return failures != 0;\n}\n'
    return run_host_program(program + main, tmp_path).strip()


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_swizzle_shifts_fold_and_phases_are_conflict_free(tmp_path) -> None:
    checks = [f"check<{r}, {c}>();" for r, c in TILES] + [f"check<{r}, {c}, 4>();" for r, c in TF32_K_MAJOR]
    assert run_checks(PROGRAM, checks, tmp_path) == "0 failures"


# tf32's word tiles: ROWS = BK rows of k, COLS = BM or BN fp32 elements (SwizzledTile<..., 4, true>).
WORDS_PROGRAM = r"""
#include <cstdio>
#include "sm80/gemm_kernel.cuh"

static int failures = 0;

template <int ROWS, int COLS>
void check_words() {
  using Tile = gemmgen::sm80::SwizzledTile<ROWS, COLS, 4, true>;
  constexpr int kMmaN = gemmgen::sm80::kMmaN;  // a fragment's rows (A: m, m + 8) and columns (B: n) come in 8s
  // Every element has its own word inside the tile, at the place of its chunk that cp.async writes.
  static bool seen[ROWS * COLS];
  for (bool& s : seen) s = false;
  for (int row = 0; row < ROWS; ++row)
    for (int e = 0; e < COLS; ++e) {
      const unsigned at = Tile::element_offset(row, e, 0);
      const unsigned chunk_at = Tile::offset(row, e / Tile::kChunkElems) + (e % Tile::kChunkElems) * 4;
      if (at % 4 || at / 4 >= ROWS * COLS || seen[at / 4] || at != chunk_at) {
        if (failures++ < 10) std::printf("words<%d,%d>: element (%d, %d) at %u\n", ROWS, COLS, row, e, at);
      } else {
        seen[at / 4] = true;
      }
    }
  // A fragment load: lane (g, t) reads element mn + g of row k0 + t; the folded address is the plain one, and the
  // 32 lanes hit 32 different banks.
  for (int k0 = 0; k0 + Tile::kWordRows <= ROWS; k0 += Tile::kPeriodRows)
    for (int mn = 0; mn + kMmaN <= COLS; mn += kMmaN) {
      unsigned banks = 0;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        const unsigned at = Tile::fragment_word(mn, k0, g, t);
        if (at != Tile::element_offset(k0 + t, mn + g, 0) && failures++ < 10)
          std::printf("words<%d,%d>: fragment_word(%d, %d, %d, %d) = %u, element (%d, %d) is at %u\n", ROWS, COLS,
                      mn, k0, g, t, at, k0 + t, mn + g, Tile::element_offset(k0 + t, mn + g, 0));
        banks |= 1u << ((at / 4) % 32);
      }
      if (banks != 0xffffffffu && failures++ < 10)
        std::printf("words<%d,%d>: fragment rows %d..%d at %d hit banks %#x\n", ROWS, COLS, k0, k0 + 3, mn, banks);
    }
  // A cp.async phase: eight consecutive chunks of the row-major walk cover the eight 16-byte bank groups.
  for (int first = 0; first + 8 <= ROWS * Tile::kChunksPerRow; first += 8) {
    unsigned groups = 0;
    for (int i = first; i < first + 8; ++i)
      groups |= 1u << ((Tile::offset(i / Tile::kChunksPerRow, i % Tile::kChunksPerRow) / 16) % 8);
    if (groups != 0xffu && failures++ < 10)
      std::printf("words<%d,%d>: copy chunks %d..%d hit bank groups %#x\n", ROWS, COLS, first, first + 7, groups);
  }
  // Shifts by whole periods of rows add to the address.
  for (int shift = 0; shift < ROWS; shift += Tile::kPeriodRows)
    for (int row = 0; row + shift < ROWS; ++row)
      for (int chunk = 0; chunk < Tile::kChunksPerRow; ++chunk)
        if (Tile::offset(row + shift, chunk) != Tile::offset(row, chunk, shift) && failures++ < 10)
          std::printf("words<%d,%d>: offset(%d + %d, %d) does not fold\n", ROWS, COLS, row, shift, chunk);
}
"""


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_tf32_word_tiles_are_conflict_free_and_fold(tmp_path) -> None:
    checks = [f"check_words<{r}, {c}>();" for r, c in TF32_WORDS]
    assert run_checks(WORDS_PROGRAM, checks, tmp_path) == "0 failures"


# The staged epilogue's slab (EpilogueSlab<ROW_BYTES>, ROW_BYTES = WARP_N x sizeof(Out)): every row
# width a warp tile can have, for 16-bit and fp32 outputs.
SLAB_PROGRAM = r"""
#include <cstdio>
#include "sm80/gemm_kernel.cuh"

static int failures = 0;

static void report(const char* what, int row_bytes, int a, int b, const int (&hits)[8], int want) {
  for (int g = 0; g < 8; ++g)
    if (hits[g] != want) {
      if (failures++ < 10) std::printf("slab %d B: %s %d/%d: bank group %d hit %d times, want %d\n", row_bytes, what, a, b, g, hits[g], want);
      return;
    }
}

template <int ROW_BYTES>
void check(int out_bytes) {
  using Slab = gemmgen::sm80::EpilogueSlab<ROW_BYTES>;
  constexpr int kRows = gemmgen::sm80::kMmaM;
  // A bijection onto the slab's 16-byte chunks.
  static bool seen[kRows * Slab::kChunks];
  for (bool& s : seen) s = false;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < Slab::kChunks; ++c) {
      const unsigned at = Slab::offset(r, c);
      if (at % 16 != 0 || at / 16 >= kRows * Slab::kChunks || seen[at / 16]) {
        if (failures++ < 10) std::printf("slab %d B: chunk (%d, %d) at %u collides or leaves the slab\n", ROW_BYTES, r, c, at);
      } else {
        seen[at / 16] = true;
      }
    }
  // A fragment write: 8 rows x the chunks of one n8 column (8 outputs of out_bytes), each bank group
  // as often as any other.
  const int column_bytes = 8 * out_bytes;
  for (int nt = 0; nt < ROW_BYTES / column_bytes; ++nt)
    for (int half = 0; half < 2; ++half) {
      int hits[8] = {};
      for (int r = 8 * half; r < 8 * half + 8; ++r)
        for (int c = nt * column_bytes / 16; c < (nt + 1) * column_bytes / 16; ++c) ++hits[(Slab::offset(r, c) / 16) % 8];
      report("write of column, half", ROW_BYTES, nt, half, hits, column_bytes / 16);
    }
  // A read: 32 lanes, consecutive chunks row by row: 4 per bank group, the least 512 bytes can take.
  for (int step = 0; step < kRows * Slab::kChunks / 32; ++step) {
    int hits[8] = {};
    for (int i = 32 * step; i < 32 * step + 32; ++i) ++hits[(Slab::offset(i / Slab::kChunks, i % Slab::kChunks) / 16) % 8];
    report("read step", ROW_BYTES, step, 0, hits, 4);
  }
}
"""


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_epilogue_slab_is_a_conflict_free_bijection(tmp_path) -> None:
    warp_ns = (16, 32, 64, 128)  # WARP_N = BN / WARPS_N: at least two n8 tiles, at most 128
    checks = [f"check<{wn * out}>({out});" for wn in warp_ns for out in (2, 4)]
    assert run_checks(SLAB_PROGRAM, checks, tmp_path) == "0 failures"
