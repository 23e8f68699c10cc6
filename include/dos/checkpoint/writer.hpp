#pragma once
/// @file
/// @brief Saving: `Snapshot` copies an optimizer's state into host memory it keeps
///        between saves, and `write_snapshot` writes that copy crash-consistently.
///
/// On-disk order, so that a crash at any instant leaves the previous checkpoint
/// loadable: (1) the rank file is written under a temporary name, fsynced and renamed
/// to a name no earlier save used; (2) the directory is fsynced; (3) `index.json` is
/// written the same way, which is the commit point: it names the new file; (4) the
/// files the new index no longer names are removed. Before (3) the old index and its
/// files are untouched; after it the new ones are complete and durable.

#include "dos/checkpoint/file_io.hpp"
#include "dos/checkpoint/hash.hpp"
#include "dos/checkpoint/index.hpp"
#include "dos/checkpoint/safetensors.hpp"
#include "dos/checkpoint/target.hpp"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace dos::checkpoint {

/// @brief A point-in-time copy of an optimizer's state, in the file's layout. The
///        buffer is allocated on the first capture and reused by later ones (it only
///        grows), so a training loop that saves periodically allocates once.
class Snapshot {
 public:
  /// @brief Copies @p opt's state and counters. Nothing is written to disk.
  /// @throws std::invalid_argument when the optimizer cannot read a state tensor.
  template <CheckpointTarget O>
  void capture(O& opt) {
    prepare(opt);
    unsigned threads = copy_threads;
    if constexpr (requires { requires O::interleaved; }) threads = 1;  // one synchronous stream
    copy_state(threads, [&](const SavedTensor& t, std::span<float> out) { opt.read_state(t.param, t.kind, out); });
  }

  /// @brief The first half of a capture, on the caller's thread: the counters, the
  ///        tensor list and room for the copy. `copy_held` does the rest.
  template <CheckpointTarget O>
  void prepare(O& opt) {
    std::vector<SavedTensor> tensors = saved_tensors(opt);
    const std::size_t total = tensors.empty() ? 0 : tensors.back().offset + tensors.back().numel;
    if (total > capacity_) {
      // for_overwrite: the pages are first touched by the copy itself, not zeroed first.
      data_ = std::make_unique_for_overwrite<float[]>(total);
      capacity_ = total;
    }
    CheckpointIndex x;
    x.dos_version = dos_version_string();
    x.step_count = opt.step_count();
    x.schedule_index = opt.schedule_index();
    x.loss_scaling = opt.options().loss_scaling.has_value();
    x.loss_scale = opt.loss_scale();
    x.growth_tracker = opt.loss_scale_growth_tracker();
    x.subgroup_elements = opt.options().subgroup_elements;
    for (std::size_t g = 0; g < opt.num_groups(); ++g) x.groups.push_back(opt.hyperparameters(g));
    for (std::size_t p = 0; p < opt.num_params(); ++p)
      x.params.push_back({opt.param_numel(p), opt.param_record(p).dtype, opt.param_record(p).group, opt.step_count(p)});
    if constexpr (requires { HardwareProfile(opt.cost_model().profile()); }) x.hardware_profile = opt.cost_model().profile();
    tensors_ = std::move(tensors);
    index_ = std::move(x);
    elements_ = total;
  }

  /// @brief The second half of a capture, on any thread: copies the state `prepare`
  ///        listed through hold @p h, which keeps the optimizer from changing it.
  /// @throws std::invalid_argument for a hold on another optimizer.
  template <CheckpointTarget O>
    requires requires(const O& o, const StateHold& h, std::span<float> out) { o.read_state(h, 0, StateKind::exp_avg, out); }
  void copy_held(const O& opt, const StateHold& h) {
    copy_state(copy_threads, [&](const SavedTensor& t, std::span<float> out) { opt.read_state(h, t.param, t.kind, out); });
  }

  const CheckpointIndex& index() const noexcept { return index_; }

  /// @brief Threads a capture copies with, where the optimizer allows concurrent
  ///        reads (0: every hardware thread).
  unsigned copy_threads = 0;
  const std::vector<SavedTensor>& tensors() const noexcept { return tensors_; }
  /// @brief The captured floats, `elements()` of them, tensor after tensor.
  std::span<const float> data() const noexcept { return {data_.get(), elements_}; }
  std::size_t elements() const noexcept { return elements_; }
  /// @brief Floats allocated (the largest capture so far).
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  // The copy is bound by memory bandwidth, so it is spread over threads, tensor by
  // tensor. A device optimizer's read_state may pull resident subgroups through its
  // one synchronous stream, which is not safe to share: its captures use one thread.
  template <class Read>
  void copy_state(unsigned threads, Read&& read) {
    const std::vector<SavedTensor>& tensors = tensors_;
    const auto one = [&](const SavedTensor& t) { read(t, std::span<float>(data_.get() + t.offset, t.numel)); };
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    threads = static_cast<unsigned>(std::min<std::size_t>(threads, tensors.size()));
    if (threads <= 1) {
      for (const SavedTensor& t : tensors) one(t);
      return;
    }
    // Largest first, each to the least loaded thread.
    std::vector<const SavedTensor*> order;
    for (const SavedTensor& t : tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->numel > b->numel; });
    std::vector<std::vector<const SavedTensor*>> bins(threads);
    std::vector<std::size_t> load(threads, 0);
    for (const SavedTensor* t : order) {
      const std::size_t k = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      bins[k].push_back(t);
      load[k] += t->numel;
    }
    std::vector<std::exception_ptr> errors(threads);
    {
      std::vector<std::jthread> workers;
      for (unsigned k = 1; k < threads; ++k)
        workers.emplace_back([&, k] {
          try {
            for (const SavedTensor* t : bins[k]) one(*t);
          } catch (...) {
            errors[k] = std::current_exception();
          }
        });
      try {
        for (const SavedTensor* t : bins[0]) one(*t);
      } catch (...) {
        errors[0] = std::current_exception();
      }
    }
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  std::unique_ptr<float[]> data_;
  std::size_t capacity_ = 0, elements_ = 0;
  std::vector<SavedTensor> tensors_;
  CheckpointIndex index_;
};

namespace detail {

inline bool is_rank_file_name(const std::string& name) {
  const auto ends_with = [&](std::string_view s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return name.rfind("rank", 0) == 0 && (ends_with(".safetensors") || ends_with(".tmp"));
}

// Removes the rank files (and temporary files of interrupted saves) @p keep does not
// name. Failures only leave garbage behind, never a wrong checkpoint, so they are
// ignored.
inline void remove_stale(const std::filesystem::path& dir, const std::string& keep) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != keep && (is_rank_file_name(name) || name == std::string(index_file_name) + ".tmp"))
      std::filesystem::remove(e.path(), ec);
  }
}

}  // namespace detail

/// @brief One tensor to write: its name, its floats, and its shape (empty: 1-D).
struct TensorData {
  std::string name;
  std::span<const float> data;
  std::vector<std::uint64_t> shape;
};

/// @brief Writes @p tensors as rank 0's file and @p index (whose `ranks` it fills in)
///        to checkpoint directory @p dir (created if missing), crash-consistently
///        (see the file comment), replacing the checkpoint there.
/// @throws std::runtime_error naming the path for any I/O failure; the previous
///         checkpoint in @p dir then still loads.
inline void write_checkpoint(const std::filesystem::path& dir, CheckpointIndex index, const std::vector<TensorData>& tensors) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw_runtime_error("cannot create checkpoint directory {}: {}", dir.string(), ec.message());

  RankFile rank;
  rank.rank = 0;
  // A name no earlier save used: the index being replaced still names its own file.
  std::random_device rd;
  const std::uint64_t nonce = (std::uint64_t{rd()} << 32) ^ rd();
  rank.file = fmt::format("rank{:05}-step{}-{:016x}.safetensors", rank.rank, index.step_count, nonce);

  std::vector<TensorEntry> entries;
  std::vector<std::pair<const void*, std::size_t>> parts(1);
  std::uint64_t offset = 0;
  for (const TensorData& t : tensors) {
    std::vector<std::uint64_t> shape = t.shape.empty() ? std::vector<std::uint64_t>{t.data.size()} : t.shape;
    entries.push_back({t.name, "F32", std::move(shape), offset, offset + t.data.size_bytes()});
    offset += t.data.size_bytes();
    rank.checksums[t.name] = checksum_string(xxh64(t.data.data(), t.data.size_bytes()));
    parts.emplace_back(t.data.data(), t.data.size_bytes());
  }
  const std::map<std::string, std::string> metadata{{"format", "dos"},
                                                    {"dos.format_version", std::to_string(index.version)},
                                                    {"dos.step_count", std::to_string(index.step_count)},
                                                    {"dos.rank", std::to_string(rank.rank)}};
  const std::string header = make_safetensors_header(entries, metadata);
  parts[0] = {header.data(), header.size()};
  rank.bytes = header.size() + offset;
  detail::write_durably(dir / (rank.file + ".tmp"), dir / rank.file, parts);
  detail::sync_directory(dir);  // the rank file's name is durable before an index names it

  const std::string keep = rank.file;
  index.ranks.assign(1, std::move(rank));
  const std::string json = index_to_json(index);
  const std::pair<const void*, std::size_t> index_parts[] = {{json.data(), json.size()}};
  detail::write_durably(dir / (std::string(index_file_name) + ".tmp"), dir / index_file_name, index_parts);
  detail::sync_directory(dir);  // the commit point
  detail::remove_stale(dir, keep);
}

/// @brief Writes snapshot @p s to checkpoint directory @p dir; see `write_checkpoint`.
/// @throws std::runtime_error naming the path for any I/O failure.
inline void write_snapshot(const Snapshot& s, const std::filesystem::path& dir) {
  std::vector<TensorData> tensors;
  tensors.reserve(s.tensors().size());
  for (const SavedTensor& t : s.tensors()) tensors.push_back({t.name, s.data().subspan(t.offset, t.numel), {}});
  write_checkpoint(dir, s.index(), tensors);
}

}  // namespace dos::checkpoint
