// Balanced tensor fragmentation: LPT greedy over row blocks (docs/protocol.md §8).
#include "core/fragments.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/hash.h"

namespace dloco {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorSpec::rows() const { return shape.empty() ? 1 : shape[0]; }

int64_t TensorSpec::row_numel() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

int FragmentLayout::find_tensor(const std::string& name) const {
  // tensors are sorted by name, so a binary search finds it.
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorSpec& t, const std::string& n) { return t.name < n; });
  if (it == tensors.end() || it->name != name) return -1;
  return static_cast<int>(it - tensors.begin());
}

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// The text the hash is computed over: every tensor's name and shape, then every fragment's blocks. Two processes
// agree on the hash iff they agree on the whole layout.
std::string canonical_text(const FragmentLayout& layout) {
  std::ostringstream os;
  os << "dloco-fragments-v1\n";
  for (const TensorSpec& t : layout.tensors) os << "tensor " << t.name << " " << shape_text(t.shape) << "\n";
  for (size_t p = 0; p < layout.fragments.size(); ++p) {
    os << "fragment " << p;
    for (const FragmentBlock& b : layout.fragments[p].blocks) os << " " << b.tensor_index << ":" << b.row_begin << "-" << b.row_end;
    os << "\n";
  }
  return os.str();
}


FragmentBlock make_block(const std::vector<TensorSpec>& tensors, int index, int64_t row_begin, int64_t row_end) {
  const int64_t row_numel = tensors[index].row_numel();
  return FragmentBlock{index, row_begin, row_end, row_begin * row_numel, (row_end - row_begin) * row_numel};
}

void check_fragment_index(const FragmentLayout& layout, int p) {
  if (p < 0 || p >= layout.num_fragments()) {
    throw InputError("fragment index " + std::to_string(p) + " is out of range: the layout has " +
                     std::to_string(layout.num_fragments()) + " fragments");
  }
}

template <typename Span>
void check_tensor_spans(const FragmentLayout& layout, const std::vector<Span>& tensors, const char* what) {
  if (tensors.size() != layout.tensors.size()) {
    throw InputError(std::string(what) + ": got " + std::to_string(tensors.size()) + " tensor buffers, the layout has " +
                     std::to_string(layout.tensors.size()) + " tensors");
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (static_cast<int64_t>(tensors[i].size()) != layout.tensors[i].numel()) {
      throw InputError(std::string(what) + ": tensor '" + layout.tensors[i].name + "' buffer has " +
                       std::to_string(tensors[i].size()) + " elements, its shape " +
                       shape_text(layout.tensors[i].shape) + " has " + std::to_string(layout.tensors[i].numel()));
    }
  }
}

void check_fragment_buffer(const FragmentLayout& layout, int p, size_t size, const char* what) {
  if (static_cast<int64_t>(size) != layout.fragments[p].numel) {
    throw InputError(std::string(what) + ": fragment " + std::to_string(p) + " buffer has " + std::to_string(size) +
                     " elements, the layout says " + std::to_string(layout.fragments[p].numel));
  }
}

}  // namespace

FragmentLayout make_fragment_layout(std::vector<TensorSpec> tensors, int P, bool split_large_tensors) {
  if (P < 1) throw InputError("number of fragments P must be >= 1, got " + std::to_string(P));
  if (tensors.empty()) throw InputError("cannot fragment an empty list of tensors");
  std::set<std::string> names;
  for (const TensorSpec& t : tensors) {
    if (t.name.empty()) throw InputError("a tensor has an empty name");
    if (t.shape.empty()) throw InputError("tensor '" + t.name + "' has an empty shape (use {1} for a scalar)");
    for (int64_t d : t.shape) {
      if (d < 0) throw InputError("tensor '" + t.name + "' has a negative dimension in " + shape_text(t.shape));
    }
    if (!names.insert(t.name).second) throw InputError("duplicate tensor name '" + t.name + "'");
  }

  // 1. Canonical order: by name. Nothing below depends on the caller's order.
  std::sort(tensors.begin(), tensors.end(), [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  FragmentLayout layout;
  layout.tensors = std::move(tensors);
  for (const TensorSpec& t : layout.tensors) layout.total_numel += t.numel();
  const std::vector<TensorSpec>& ts = layout.tensors;

  // 2. Blocks: a tensor of >= 2 rows larger than total/P is cut into n = ceil(numel·P/total) near-equal row ranges.
  std::vector<FragmentBlock> blocks;
  for (int i = 0; i < static_cast<int>(ts.size()); ++i) {
    const int64_t numel = ts[i].numel(), rows = ts[i].rows();
    const bool large = numel * static_cast<int64_t>(P) > layout.total_numel;  // numel > total/P, exactly
    if (!split_large_tensors || rows < 2 || !large) {
      blocks.push_back(make_block(ts, i, 0, rows));
      continue;
    }
    const int64_t n = std::min(rows, (numel * P + layout.total_numel - 1) / layout.total_numel);
    int64_t row = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t take = rows / n + (k < rows % n ? 1 : 0);
      blocks.push_back(make_block(ts, i, row, row + take));
      row += take;
    }
    DLOCO_CHECK_EQ(row, rows);
  }
  if (static_cast<int64_t>(P) > static_cast<int64_t>(blocks.size())) {
    throw InputError("P = " + std::to_string(P) + " fragments but the model splits into only " +
                     std::to_string(blocks.size()) + " blocks: lower P to at most " + std::to_string(blocks.size()));
  }

  // 3. LPT: largest block first (ties: name, then row_begin) into the lightest fragment (ties: lowest index).
  std::stable_sort(blocks.begin(), blocks.end(), [&](const FragmentBlock& a, const FragmentBlock& b) {
    if (a.numel != b.numel) return a.numel > b.numel;
    if (a.tensor_index != b.tensor_index) return a.tensor_index < b.tensor_index;  // index order == name order
    return a.row_begin < b.row_begin;
  });
  layout.fragments.resize(P);
  for (const FragmentBlock& b : blocks) {
    auto lightest = std::min_element(layout.fragments.begin(), layout.fragments.end(),
                                     [](const Fragment& x, const Fragment& y) { return x.numel < y.numel; });
    lightest->blocks.push_back(b);
    lightest->numel += b.numel;
  }
  // 4. Canonical order inside a fragment: by tensor, then rows (the gather/scatter order).
  for (Fragment& f : layout.fragments) {
    std::sort(f.blocks.begin(), f.blocks.end(), [](const FragmentBlock& a, const FragmentBlock& b) {
      return a.tensor_index != b.tensor_index ? a.tensor_index < b.tensor_index : a.row_begin < b.row_begin;
    });
  }
  layout.hash = fnv1a64(canonical_text(layout));
  return layout;
}

std::string FragmentLayout::summary() const {
  std::ostringstream os;
  int64_t largest = 0, smallest = fragments.empty() ? 0 : fragments[0].numel;
  for (const Fragment& f : fragments) {
    largest = std::max(largest, f.numel);
    smallest = std::min(smallest, f.numel);
  }
  char hash_text[17];
  std::snprintf(hash_text, sizeof hash_text, "%016llx", static_cast<unsigned long long>(hash));
  os << fragments.size() << " fragments over " << tensors.size() << " tensors, " << total_numel
     << " elements; fragment sizes " << smallest << ".." << largest << "; hash " << hash_text << "\n";
  for (size_t p = 0; p < fragments.size(); ++p) {
    os << "  fragment " << p << ": " << fragments[p].numel << " elements:";
    for (const FragmentBlock& b : fragments[p].blocks) {
      const TensorSpec& t = tensors[b.tensor_index];
      os << " " << t.name;
      if (b.row_begin != 0 || b.row_end != t.rows()) os << "[" << b.row_begin << ":" << b.row_end << "]";
    }
    os << "\n";
  }
  return os.str();
}

void validate_schedule(int H, int P) {
  if (H < 1) throw InputError("H (inner steps between syncs of a fragment) must be >= 1, got " + std::to_string(H));
  if (P < 1) throw InputError("P (number of fragments) must be >= 1, got " + std::to_string(P));
  if (H % P != 0) {
    throw InputError("H = " + std::to_string(H) + " must be a multiple of P = " + std::to_string(P) +
                     " so every fragment has its own sync step");
  }
}

int64_t fragment_offset(int p, int H, int P) {
  if (H < 1 || P < 1) throw InputError("fragment_offset needs H >= 1 and P >= 1, got H = " + std::to_string(H) +
                                       ", P = " + std::to_string(P));
  if (p < 0 || p >= P) throw InputError("fragment " + std::to_string(p) + " out of range [0, " + std::to_string(P) + ")");
  return static_cast<int64_t>(p) * H / P;
}

bool fragment_due(int p, int64_t step, int H, int P) {
  const int64_t offset = fragment_offset(p, H, P);
  const int64_t r = ((step % H) + H) % H;
  return r == offset;
}

void gather_fragment(const FragmentLayout& layout, int p, const std::vector<std::span<const float>>& tensors,
                     std::span<float> out) {
  check_fragment_index(layout, p);
  check_tensor_spans(layout, tensors, "gather_fragment");
  check_fragment_buffer(layout, p, out.size(), "gather_fragment");
  int64_t pos = 0;
  for (const FragmentBlock& b : layout.fragments[p].blocks) {
    if (b.numel > 0) std::memcpy(out.data() + pos, tensors[b.tensor_index].data() + b.offset, b.numel * sizeof(float));
    pos += b.numel;
  }
}

void scatter_fragment(const FragmentLayout& layout, int p, std::span<const float> in,
                      const std::vector<std::span<float>>& tensors) {
  check_fragment_index(layout, p);
  check_tensor_spans(layout, tensors, "scatter_fragment");
  check_fragment_buffer(layout, p, in.size(), "scatter_fragment");
  int64_t pos = 0;
  for (const FragmentBlock& b : layout.fragments[p].blocks) {
    if (b.numel > 0) std::memcpy(tensors[b.tensor_index].data() + b.offset, in.data() + pos, b.numel * sizeof(float));
    pos += b.numel;
  }
}

}  // namespace dloco
