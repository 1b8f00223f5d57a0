// Balanced tensor fragmentation (docs/protocol.md §8) and the staggered sync schedule (§2, §4).
//
// The model's parameters are split into P fragments of near-equal size with LPT greedy bin-packing; tensors
// larger than total/P are first cut into row blocks along dimension 0 (ours, on by default), so one large
// embedding cannot dwarf the other fragments. The layout is a pure function of the (name, shape) list and P:
// every learner and the syncer compute the same layout and compare its hash on connect.
//
// Units: sizes are in elements (fp32 values), never bytes. Row-major (C-contiguous) tensors are assumed.
// Deliberately not here: any tensor library. Buffers are plain std::span<float>, indexed like
// FragmentLayout::tensors.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dloco {

/// A named parameter tensor's shape. shape must have at least one dimension (a scalar is shape {1}).
struct TensorSpec {
  std::string name;            // unique, e.g. "blocks.0.attn.wq.weight"
  std::vector<int64_t> shape;  // row-major; dim 0 is the row dimension used for splitting

  /// Product of the shape (elements). 0 if any dimension is 0.
  int64_t numel() const;
  /// shape[0]: rows a tensor can be split into.
  int64_t rows() const;
  /// Elements per row: numel() / rows() (1 for a tensor with a single dimension).
  int64_t row_numel() const;
};

/// A contiguous range of rows [row_begin, row_end) along dim 0 of one tensor. offset and numel are in elements of
/// that tensor's flattened row-major data: offset = row_begin·row_numel, numel = (row_end − row_begin)·row_numel.
/// A tensor that is not split is one block covering all its rows.
struct FragmentBlock {
  int tensor_index = 0;  // index into FragmentLayout::tensors
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t offset = 0;  // elements
  int64_t numel = 0;   // elements
};

/// One fragment: its blocks in canonical order (tensor_index, then row_begin). Its flat buffer is the blocks'
/// data concatenated in that order; numel is the sum of the blocks' numel (elements).
struct Fragment {
  std::vector<FragmentBlock> blocks;
  int64_t numel = 0;
};

/// The full layout. tensors are sorted by name (the canonical order, so the order of the caller's list does not
/// matter); FragmentBlock::tensor_index and the span vectors passed to gather/scatter follow that order.
struct FragmentLayout {
  std::vector<TensorSpec> tensors;   // sorted by name
  std::vector<Fragment> fragments;   // P fragments
  int64_t total_numel = 0;           // elements over all tensors
  uint64_t hash = 0;                 // FNV-1a 64 of the canonical text (names, shapes, blocks per fragment)

  int num_fragments() const { return static_cast<int>(fragments.size()); }
  /// Index of the tensor named `name` in `tensors`, or -1 if absent.
  int find_tensor(const std::string& name) const;
  /// Human-readable multi-line description: P, totals, hash, and per fragment its size and blocks.
  std::string summary() const;
};

/// Builds the LPT layout (docs/protocol.md §8).
///  1. Sort the tensors by name. With split_large_tensors, a tensor of ≥ 2 rows with numel > total/P is cut into
///     n = min(rows, ceil(numel·P / total)) row blocks of near-equal rows (the first rows % n blocks get one more).
///  2. Sort all blocks by numel descending (ties: tensor name, then row_begin) and put each into the currently
///     lightest fragment (ties: lowest fragment index).
/// Guarantee (Graham's LPT theorem): largest fragment ≤ (4/3 − 1/(3P))·OPT, OPT the best possible layout of the
/// same blocks. Spec §8 states 4/3·max(largest block, total/P); that max is only a lower bound of OPT, so the
/// stated form holds when every block is ≤ total/(3P) but can be unreachable otherwise (e.g. 4 equal unsplittable
/// tensors in 3 fragments; see tests/core/fragments_test.cc).
/// Throws InputError if P < 1, if P exceeds the number of blocks (the message names both numbers), or if a tensor
/// has an empty shape, a negative dimension, an empty name or a duplicate name.
FragmentLayout make_fragment_layout(std::vector<TensorSpec> tensors, int P, bool split_large_tensors = true);

/// Step offset S_p = p·H/P (integer division) at which fragment p syncs (docs/protocol.md §2). Requires 0 ≤ p < P;
/// throws InputError otherwise or if H < 1 or P < 1.
int64_t fragment_offset(int p, int H, int P);

/// True when fragment p is due at global step `step`: step mod H == S_p (docs/protocol.md §4). Same errors as fragment_offset.
bool fragment_due(int p, int64_t step, int H, int P);

/// Start-up check of the sync schedule (docs/protocol.md §8): throws InputError unless H ≥ 1, P ≥ 1 and H is a multiple of P.
void validate_schedule(int H, int P);

/// Copies fragment p out of the full model: `tensors[i]` is the flat data of layout.tensors[i] (numel elements);
/// `out` (fragment numel elements) receives the fragment's blocks concatenated in block order.
/// Throws InputError if p is out of range or any size does not match the layout.
void gather_fragment(const FragmentLayout& layout, int p, const std::vector<std::span<const float>>& tensors,
                     std::span<float> out);

/// The inverse of gather_fragment: writes `in` (fragment numel elements) back into the tensors' blocks.
/// Elements outside fragment p are untouched. Throws InputError on a size mismatch or p out of range.
void scatter_fragment(const FragmentLayout& layout, int p, std::span<const float> in,
                      const std::vector<std::span<float>>& tensors);

}  // namespace dloco
