// Dataset index helpers (CPU), bound with pybind11 as megatron.core.datasets.helpers_cpp.
//
// Each function has a numpy reference in megatron/core/datasets/helpers.py that gives the
// same result bit for bit (tests/unit/test_dataset_helpers.py); these are the fast paths
// for corpora of millions of documents. Compiled with -ffp-contract=off so the blending
// arithmetic is the same IEEE double sequence as the Python reference (no fused multiply-add).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

// An output array is written in place. Given one of another dtype, a strided view or a read-only
// array, pybind11 would convert it into a temporary copy and the results would be lost without a
// word, so the bindings take plain arrays and refuse those here (TypeError / ValueError).
template <typename T>
py::array_t<T, py::array::c_style> output_array(const py::array &a, const char *name) {
  const py::dtype want = py::dtype::of<T>();
  const std::string arg = std::string("output array ") + name;
  if (!a.dtype().equal(want))
    throw py::type_error(arg + " must have dtype " + std::string(py::str(want)) + ", got " +
                         std::string(py::str(a.dtype())));
  if (a.ndim() != 1) throw py::value_error(arg + " must be 1-D, got " + std::to_string(a.ndim()) + " dims");
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(arg + " must be C-contiguous (a strided view would be written into a copy)");
  if (!a.writeable()) throw py::value_error(arg + " must be writeable");
  return py::reinterpret_borrow<py::array_t<T, py::array::c_style>>(a);
}

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

// Both blending orders write dataset ids as int16 and need outputs of at least `size` rows.
static void check_blending_args(int64_t k, int64_t index_rows, int64_t sample_rows, int64_t size) {
  if (k < 1 || k > 32767) throw std::invalid_argument("need between 1 and 32767 datasets");
  if (index_rows < size || sample_rows < size) throw std::invalid_argument("output arrays are shorter than size");
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
  check_blending_args(k, dataset_index.shape(0), sample_index.shape(0), size);
  for (int64_t d = 0; d < k; ++d)
    if (!(weights(d) > 0.0)) throw std::invalid_argument("weights must be positive");
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

// Megatron-LM's blending order (the default): sample i goes to the dataset whose share is most
// behind, weight * max(i, 1) - taken (ties: lowest index). Same arguments and outputs as above.
void build_greedy_blending_indices(py::array_t<int16_t, py::array::c_style> &dataset_index_,
                                   py::array_t<int64_t, py::array::c_style> &dataset_sample_index_,
                                   const py::array_t<double, py::array::c_style | py::array::forcecast> &weights_,
                                   int64_t size) {
  auto dataset_index = dataset_index_.mutable_unchecked<1>();
  auto sample_index = dataset_sample_index_.mutable_unchecked<1>();
  auto weights = weights_.unchecked<1>();
  const int64_t k = weights.shape(0);
  check_blending_args(k, dataset_index.shape(0), sample_index.shape(0), size);
  std::vector<int64_t> taken(k, 0);
  py::gil_scoped_release release;
  for (int64_t i = 0; i < size; ++i) {
    const double x = std::max(static_cast<double>(i), 1.0);
    int64_t best = 0;
    double best_error = weights(0) * x - static_cast<double>(taken[0]);
    for (int64_t d = 1; d < k; ++d) {
      const double error = weights(d) * x - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_index(i) = static_cast<int16_t>(best);
    sample_index(i) = taken[best];
    ++taken[best];
  }
}

// splitmix64 (Steele, Lea, Flood 2014): the one RNG of the BERT mapping, written again in helpers.py
// so both implementations draw the same numbers. std:: engines and distributions are avoided
// because their output is not specified across standard libraries.
struct SplitMix64 {
  uint64_t state;
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // [0, n), by modulo: the bias is below n / 2^64, far under anything a test could see
  uint64_t below(uint64_t n) { return next() % n; }
  // [0, 1) from the top 53 bits: exactly representable, so Python computes the same double
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
};

static int64_t bert_target(SplitMix64 &rng, double short_seq_prob, int64_t max_target) {
  // Always two draws, so the stream does not depend on which branch was taken last
  const double u = rng.uniform();
  const int64_t short_len = 2 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(max_target - 1)));
  return u < short_seq_prob ? short_len : max_target;
}

// BERT samples as runs of whole sentences: rows (first sentence, end sentence, target length).
//
// For each epoch, each document [doc_start[d], doc_end[d]) of at least min_num_sent sentences and
// with no sentence longer than max_target tokens is cut greedily: sentences are added until they
// hold target tokens (target = max_target, or with probability short_seq_prob a length drawn in
// [2, max_target]); the run is closed there if at least min_num_sent sentences are in it and at
// least min_num_sent remain, else it grows; the document's last run takes what is left. Epochs are
// added until max_num_samples rows exist (whole epochs only) or num_epochs is reached; an epoch
// that yields no row stops the loop. The rows are then Fisher-Yates shuffled with the same RNG.
template <typename T>
py::array_t<T> build_mapping_impl(const py::array_t<int64_t, py::array::c_style | py::array::forcecast> &starts_,
                                  const py::array_t<int64_t, py::array::c_style | py::array::forcecast> &ends_,
                                  const py::array_t<int32_t, py::array::c_style | py::array::forcecast> &sizes_,
                                  int64_t num_epochs, int64_t max_num_samples, int64_t max_target,
                                  double short_seq_prob, uint64_t seed, int64_t min_num_sent) {
  if (max_target < 2 || min_num_sent < 1 || num_epochs < 1)
    throw std::invalid_argument("max_target must be >= 2, min_num_sent and num_epochs >= 1");
  auto starts = starts_.unchecked<1>();
  auto ends = ends_.unchecked<1>();
  auto sizes = sizes_.unchecked<1>();
  const int64_t num_docs = starts.shape(0), num_sizes = sizes.shape(0);
  if (ends.shape(0) != num_docs) throw std::invalid_argument("doc_starts and doc_ends differ in length");
  for (int64_t d = 0; d < num_docs; ++d)
    if (starts(d) < 0 || ends(d) < starts(d) || ends(d) > num_sizes)
      throw std::out_of_range("a document's sentence range lies outside sizes");
  std::vector<T> rows;
  {
    py::gil_scoped_release release;
    SplitMix64 rng(seed);
    for (int64_t epoch = 0; epoch < num_epochs && static_cast<int64_t>(rows.size() / 3) < max_num_samples;
         ++epoch) {
      const size_t before = rows.size();
      for (int64_t d = 0; d < num_docs; ++d) {
        const int64_t first = starts(d), last = ends(d);
        if (last - first < min_num_sent) continue;
        bool too_long = false;
        for (int64_t s = first; s < last; ++s) too_long = too_long || sizes(s) > max_target;
        if (too_long) continue;
        int64_t target = bert_target(rng, short_seq_prob, max_target);
        int64_t run_start = first, run_tokens = 0;
        for (int64_t s = first; s < last; ++s) {
          run_tokens += sizes(s);
          const int64_t in_run = s + 1 - run_start, remaining = last - s - 1;
          if ((run_tokens >= target && in_run >= min_num_sent && remaining >= min_num_sent) || remaining == 0) {
            rows.push_back(static_cast<T>(run_start));
            rows.push_back(static_cast<T>(s + 1));
            rows.push_back(static_cast<T>(target));
            run_start = s + 1;
            run_tokens = 0;
            target = bert_target(rng, short_seq_prob, max_target);
          }
        }
      }
      if (rows.size() == before) break;
    }
    const int64_t n = static_cast<int64_t>(rows.size() / 3);
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
      for (int k = 0; k < 3; ++k) std::swap(rows[3 * i + k], rows[3 * j + k]);
    }
  }
  const int64_t n = static_cast<int64_t>(rows.size() / 3);
  py::array_t<T> out({n, static_cast<int64_t>(3)});
  std::copy(rows.begin(), rows.end(), out.mutable_data());
  return out;
}

py::array build_mapping(const py::array_t<int64_t, py::array::c_style | py::array::forcecast> &doc_starts,
                        const py::array_t<int64_t, py::array::c_style | py::array::forcecast> &doc_ends,
                        const py::array_t<int32_t, py::array::c_style | py::array::forcecast> &sizes,
                        int64_t num_epochs, int64_t max_num_samples, int64_t max_target, double short_seq_prob,
                        uint64_t seed, int64_t min_num_sent, bool use_int64) {
  if (use_int64)
    return build_mapping_impl<int64_t>(doc_starts, doc_ends, sizes, num_epochs, max_num_samples, max_target,
                                       short_seq_prob, seed, min_num_sent);
  return build_mapping_impl<int32_t>(doc_starts, doc_ends, sizes, num_epochs, max_num_samples, max_target,
                                     short_seq_prob, seed, min_num_sent);
}

PYBIND11_MODULE(helpers_cpp, m) {
  m.doc() = "Dataset index helpers (sample index, blending index, BERT mapping); numpy references in helpers.py";
  m.def("build_sample_idx", &build_sample_idx, py::arg("sizes"), py::arg("document_index"),
        py::arg("seq_length"), py::arg("num_epochs"), py::arg("tokens_per_epoch"),
        py::arg("add_extra_token"), py::arg("use_int64"));
  m.def("build_blending_indices",
        [](const py::array &dataset_index, const py::array &dataset_sample_index,
           const py::array_t<double, py::array::c_style | py::array::forcecast> &weights, int64_t size) {
          auto index = output_array<int16_t>(dataset_index, "dataset_index");
          auto sample_index = output_array<int64_t>(dataset_sample_index, "dataset_sample_index");
          build_blending_indices(index, sample_index, weights, size);
        },
        py::arg("dataset_index"),
        py::arg("dataset_sample_index"), py::arg("weights"), py::arg("size"));
  m.def("build_greedy_blending_indices", &build_greedy_blending_indices, py::arg("dataset_index"),
        py::arg("dataset_sample_index"), py::arg("weights"), py::arg("size"));
  m.def("build_mapping", &build_mapping, py::arg("doc_starts"), py::arg("doc_ends"), py::arg("sizes"),
        py::arg("num_epochs"), py::arg("max_num_samples"), py::arg("max_target"), py::arg("short_seq_prob"),
        py::arg("seed"), py::arg("min_num_sent"), py::arg("use_int64"));
}
