// Dataset index helpers (CPU), bound with pybind11 as megatron.core.datasets.helpers_cpp.
//
// Each function has a numpy reference in megatron/core/datasets/helpers.py that gives the
// same result bit for bit (tests/unit/test_dataset_helpers.py); these are the fast paths
// for corpora of millions of documents. Compiled with -ffp-contract=off so the blending
// arithmetic is the same IEEE double sequence as the Python reference (no fused multiply-add).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace py = pybind11;

// Sample boundaries for packing documents into samples of seq_length (+ extra) tokens.
//
// The documents document_index[0], document_index[1], ... are read as one token stream.
// Boundary i is stream position i * seq_length written as (j, offset): j indexes
// document_index, offset is the position inside that document. Boundary 0 is (0, 0); every
// other boundary lies inside a non-empty document (empty documents are stepped over).
// Sample i runs from boundary i to boundary i + 1 inclusive: seq_length + 1 tokens.
// Returns [num_samples + 1, 2], num_samples = (num_epochs * tokens_per_epoch - extra) / seq_length.
template <typename T>
py::array_t<T> build_sample_idx_impl(const py::array_t<int32_t, py::array::c_style | py::array::forcecast> &sizes_,
                                     const py::array_t<int32_t, py::array::c_style | py::array::forcecast> &doc_idx_,
                                     int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch,
                                     int64_t add_extra_token) {
  if (seq_length < 1 || num_epochs < 1 || tokens_per_epoch < 1)
    throw std::invalid_argument("seq_length, num_epochs and tokens_per_epoch must be positive");
  auto sizes = sizes_.unchecked<1>();
  auto doc_idx = doc_idx_.unchecked<1>();
  const int64_t num_docs = doc_idx.shape(0);
  const int64_t num_sizes = sizes.shape(0);
  const int64_t num_samples = (num_epochs * tokens_per_epoch - add_extra_token) / seq_length;
  if (num_samples < 0) throw std::invalid_argument("fewer tokens than one sample");
  if (num_docs == 0 && num_samples > 0) throw std::invalid_argument("empty document index");

  py::array_t<T> out({num_samples + 1, static_cast<int64_t>(2)});
  auto o = out.template mutable_unchecked<2>();
  {
    py::gil_scoped_release release;  // pure C++ from here on
    o(0, 0) = 0;
    o(0, 1) = 0;
    int64_t j = 0;          // current entry of doc_idx
    int64_t doc_start = 0;  // stream position where that document starts
    bool overrun = false;
    for (int64_t i = 1; i <= num_samples && !overrun; ++i) {
      const int64_t pos = i * seq_length;
      for (;;) {  // advance to the document containing pos
        const int64_t d = doc_idx(j);
        if (d < 0 || d >= num_sizes) { overrun = true; break; }
        const int64_t end = doc_start + sizes(d);
        if (pos < end) break;
        doc_start = end;
        if (++j >= num_docs) { overrun = true; break; }
      }
      o(i, 0) = static_cast<T>(j);
      o(i, 1) = static_cast<T>(pos - doc_start);
    }
    if (overrun)
      throw std::out_of_range("document index out of range, or its documents hold fewer tokens than "
                              "num_epochs * tokens_per_epoch");
  }
  return out;
}

py::array build_sample_idx(const py::array_t<int32_t, py::array::c_style | py::array::forcecast> &sizes,
                           const py::array_t<int32_t, py::array::c_style | py::array::forcecast> &doc_idx,
                           int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch,
                           int64_t add_extra_token, bool use_int64) {
  if (use_int64)
    return build_sample_idx_impl<int64_t>(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, add_extra_token);
  return build_sample_idx_impl<int32_t>(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, add_extra_token);
}

// Blend `size` samples from datasets with weights summing to 1, so that after every prefix of n
// samples each dataset has been taken within 1 - 1/(2k - 2) of weight * n times (k datasets;
// Tijdeman's chairman assignment, 1980). For sample n (1-based), dataset d is eligible when its
// deficit weight * n - taken >= sigma = 1/(2k - 2); among the eligible, take the one whose next
// turn is due first, (taken + 1 - sigma) / weight (ties: lowest index). Should rounding leave none
// eligible, take the largest deficit. Megatron-LM's rule (largest deficit only) can lag by ~1.6.
// Writes dataset_index[i] (which dataset) and dataset_sample_index[i] (its n-th sample).
void build_blending_indices(py::array_t<int16_t, py::array::c_style> &dataset_index_,
                            py::array_t<int64_t, py::array::c_style> &dataset_sample_index_,
                            const py::array_t<double, py::array::c_style | py::array::forcecast> &weights_,
                            int64_t size) {
  auto dataset_index = dataset_index_.mutable_unchecked<1>();
  auto sample_index = dataset_sample_index_.mutable_unchecked<1>();
  auto weights = weights_.unchecked<1>();
  const int64_t k = weights.shape(0);
  if (k < 1 || k > 32767) throw std::invalid_argument("need between 1 and 32767 datasets");
  for (int64_t d = 0; d < k; ++d)
    if (!(weights(d) > 0.0)) throw std::invalid_argument("weights must be positive");
  if (dataset_index.shape(0) < size || sample_index.shape(0) < size)
    throw std::invalid_argument("output arrays are shorter than size");
  const double sigma = k > 1 ? 1.0 / static_cast<double>(2 * k - 2) : 0.0;
  std::vector<int64_t> taken(k, 0);
  py::gil_scoped_release release;
  for (int64_t i = 0; i < size; ++i) {
    const double n = static_cast<double>(i + 1);
    int64_t best = -1, behind = 0;
    double best_due = 0.0, most_behind = 0.0;
    for (int64_t d = 0; d < k; ++d) {
      const double deficit = weights(d) * n - static_cast<double>(taken[d]);
      if (d == 0 || deficit > most_behind) {
        most_behind = deficit;
        behind = d;
      }
      if (deficit >= sigma) {
        const double due = (static_cast<double>(taken[d]) + 1.0 - sigma) / weights(d);
        if (best < 0 || due < best_due) {
          best_due = due;
          best = d;
        }
      }
    }
    if (best < 0) best = behind;
    dataset_index(i) = static_cast<int16_t>(best);
    sample_index(i) = taken[best];
    ++taken[best];
  }
}

PYBIND11_MODULE(helpers_cpp, m) {
  m.doc() = "Dataset index helpers (sample index, blending index); numpy references in helpers.py";
  m.def("build_sample_idx", &build_sample_idx, py::arg("sizes"), py::arg("document_index"),
        py::arg("seq_length"), py::arg("num_epochs"), py::arg("tokens_per_epoch"),
        py::arg("add_extra_token"), py::arg("use_int64"));
  m.def("build_blending_indices", &build_blending_indices, py::arg("dataset_index"),
        py::arg("dataset_sample_index"), py::arg("weights"), py::arg("size"));
}
