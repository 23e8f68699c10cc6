#pragma once
/// @file
/// @brief Loading: `CheckpointReader` maps a checkpoint and checks it, and `load_into`
///        applies it to an optimizer only after every check passed.

#include "dos/checkpoint/file_io.hpp"
#include "dos/checkpoint/hash.hpp"
#include "dos/checkpoint/index.hpp"
#include "dos/checkpoint/safetensors.hpp"
#include "dos/checkpoint/target.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace dos::checkpoint {

/// @brief A checkpoint directory, mapped read-only: the parsed index and every rank
///        file's parsed header. Construction checks the files' structure; `tensor()`
///        checks one tensor's type, size and checksum.
class CheckpointReader {
 public:
  /// @throws std::runtime_error naming the file for a missing or unreadable file, an
  ///         invalid index or header, a size that differs from the index's, or a
  ///         tensor that two files hold or whose checksum the index lacks.
  explicit CheckpointReader(const std::filesystem::path& dir) : dir_(dir), index_path_(dir / index_file_name) {
    if (!std::filesystem::exists(index_path_))
      throw_runtime_error("{}: no checkpoint index (nothing was saved there, or no save completed)", index_path_.string());
    {
      const detail::MappedFile m(index_path_);
      index_ = parse_index({reinterpret_cast<const char*>(m.data()), m.size()}, index_path_.string());
    }
    for (std::size_t k = 0; k < index_.ranks.size(); ++k) {
      const RankFile& rank = index_.ranks[k];
      File f;
      f.map = std::make_unique<detail::MappedFile>(dir / rank.file);
      const std::string name = f.map->path().string();
      if (f.map->size() != rank.bytes)
        throw_runtime_error("{}: {}: {} bytes, but the index says {}", name, f.map->size() < rank.bytes ? "truncated" : "wrong size",
                            f.map->size(), rank.bytes);
      const std::size_t head = std::min<std::size_t>(f.map->size(), 8 + max_header_bytes);
      f.header = parse_safetensors_header({reinterpret_cast<const char*>(f.map->data()), head}, f.map->size(), name);
      for (std::size_t e = 0; e < f.header.tensors.size(); ++e) {
        const std::string& t = f.header.tensors[e].name;
        if (!rank.checksums.contains(t)) throw_runtime_error("{}: tensor {}: the index has no checksum for it", name, t);
        if (const auto it = where_.find(t); it != where_.end())
          throw_runtime_error("{}: tensor {} is also in {}", name, t, files_[it->second.first].map->path().string());
        where_[t] = {k, e};
      }
      for (const auto& [t, sum] : rank.checksums)
        if (!where_.contains(t) || where_[t].first != k)
          throw_runtime_error("{}: tensor {} is missing (the index lists it for this file)", name, t);
      files_.push_back(std::move(f));
    }
  }

  const CheckpointIndex& index() const noexcept { return index_; }
  const std::filesystem::path& index_path() const noexcept { return index_path_; }
  /// @brief Every tensor name in the checkpoint.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, at] : where_) out.push_back(name);
    return out;
  }
  bool contains(const std::string& name) const { return where_.contains(name); }

  /// @brief Tensor @p name's floats, after checking its type, that it has @p numel
  ///        elements, and its checksum.
  /// @throws std::runtime_error naming the file and the tensor otherwise.
  std::span<const float> tensor(const std::string& name, std::size_t numel) const {
    const auto it = where_.find(name);
    if (it == where_.end()) throw_runtime_error("{}: tensor {} is missing from the checkpoint", dir_.string(), name);
    const File& f = files_[it->second.first];
    const TensorEntry& e = f.header.tensors[it->second.second];
    const std::string file = f.map->path().string();
    if (e.dtype != "F32") throw_runtime_error("{}: tensor {} is {}; dos state is F32", file, name, e.dtype);
    if (e.end - e.begin != numel * 4)
      throw_runtime_error("{}: tensor {} has {} elements, the optimizer's parameter has {}", file, name, (e.end - e.begin) / 4, numel);
    const std::byte* bytes = f.map->data() + f.header.data_start + e.begin;
    const std::string sum = checksum_string(xxh64(bytes, e.end - e.begin));
    const std::string& expected = index_.ranks[it->second.first].checksums.at(name);
    if (sum != expected)
      throw_runtime_error("{}: tensor {}: checksum {} does not match the index's {}; the file is corrupted", file, name, sum, expected);
    if (reinterpret_cast<std::uintptr_t>(bytes) % alignof(float) != 0) {
      // Another writer's unpadded header: copy, as floats cannot be read in place.
      auto& copy = copies_[name];
      copy.resize(numel);
      std::memcpy(copy.data(), bytes, numel * 4);
      return copy;
    }
    return {reinterpret_cast<const float*>(bytes), numel};
  }

 private:
  struct File {
    std::unique_ptr<detail::MappedFile> map;
    SafetensorsHeader header;
  };
  std::filesystem::path dir_, index_path_;
  CheckpointIndex index_;
  std::vector<File> files_;
  std::map<std::string, std::pair<std::size_t, std::size_t>> where_;  // name -> (file, entry)
  mutable std::map<std::string, std::vector<float>> copies_;
};

/// @brief Checks that checkpoint @p r fits optimizer @p opt, then restores it: state
///        tensors, hyperparameters (learning rates included), the step count, the
///        schedule index and the loss scaler. The subgroup size may differ (state is
///        stored per parameter, so any partition reads it). LR schedules are code: set
///        them again; they resume from the restored index.
/// @throws std::invalid_argument when the checkpoint is of a different model
///         (parameter count, sizes, types, groups, amsgrad) or was saved with loss
///         scaling and @p opt has none; std::runtime_error for a missing, extra or
///         corrupted tensor or invalid values. Nothing of @p opt changes then.
template <CheckpointTarget O>
void load_into(O& opt, const CheckpointReader& r) {
  const CheckpointIndex& x = r.index();
  const std::string file = r.index_path().string();
  if (x.params.size() != opt.num_params())
    throw_invalid_argument("{}: the checkpoint holds {} parameters, this optimizer {} (a different model?)", file,
                           x.params.size(), opt.num_params());
  if (x.groups.size() != opt.num_groups())
    throw_invalid_argument("{}: the checkpoint has {} parameter groups, this optimizer {}", file, x.groups.size(), opt.num_groups());
  for (std::size_t p = 0; p < x.params.size(); ++p) {
    if (x.params[p].numel != opt.param_numel(p))
      throw_invalid_argument("{}: parameter {} has {} elements in the checkpoint, {} in this optimizer (a different model?)",
                             file, p, x.params[p].numel, opt.param_numel(p));
    if (x.params[p].dtype != opt.param_record(p).dtype)
      throw_invalid_argument("{}: parameter {} is {} in the checkpoint, {} in this optimizer", file, p,
                             dtype_name(x.params[p].dtype), dtype_name(opt.param_record(p).dtype));
    if (x.params[p].group != opt.param_record(p).group)
      throw_invalid_argument("{}: parameter {} is in group {} in the checkpoint, {} in this optimizer", file, p,
                             x.params[p].group, opt.param_record(p).group);
  }
  for (std::size_t g = 0; g < x.groups.size(); ++g) {
    if (x.groups[g].amsgrad != opt.hyperparameters(g).amsgrad)
      throw_invalid_argument("{}: parameter group {} has amsgrad {} in the checkpoint, {} in this optimizer", file, g,
                             x.groups[g].amsgrad, opt.hyperparameters(g).amsgrad);
    try {
      validate(x.groups[g], g);
    } catch (const std::invalid_argument& e) {
      throw_runtime_error("{}: {}", file, std::string_view(e.what()).substr(5));  // drop the inner "dos: "
    }
  }
  const auto& scaling = opt.options().loss_scaling;
  if (x.loss_scaling) {
    if (!scaling) throw_invalid_argument("{}: the checkpoint was saved with loss scaling, this optimizer has none", file);
    int e = 0;
    if (!dos::detail::finite_bits(x.loss_scale) || x.loss_scale <= 0 || std::frexp(x.loss_scale, &e) != 0.5)
      throw_runtime_error("{}: loss_scaler.scale {} is not a finite positive power of two", file, x.loss_scale);
    if (x.growth_tracker < 0 || x.growth_tracker >= scaling->growth_interval)
      throw_runtime_error("{}: loss_scaler.growth_tracker {} is outside [0, {}) (this optimizer's growth_interval)", file,
                          x.growth_tracker, scaling->growth_interval);
  }
  if (x.step_count == INT64_MAX) throw_runtime_error("{}: step_count {} is out of range", file, x.step_count);

  // The master of an fp32 parameter is optional both ways: a checkpoint saved where
  // the parameter lived on a device has one (it equals the value), one saved from the
  // host or from torch has none (dos's copy then comes from the framework's value,
  // read when the optimizer was built).
  std::vector<SavedTensor> wanted;
  for (SavedTensor& t : saved_tensors(opt))
    if (t.kind != StateKind::master || x.params[t.param].dtype != DType::f32 || r.contains(t.name)) wanted.push_back(std::move(t));
  for (std::size_t p = 0; p < x.params.size(); ++p) {
    const std::string name = fmt::format("state.{}.master", p);
    if (x.params[p].dtype == DType::f32 && !opt.param_has_master(p) && r.contains(name))
      wanted.push_back({name, p, StateKind::master, opt.param_numel(p), 0});
  }
  // Every tensor checked (type, size, checksum) before any is written.
  std::set<std::string> names;
  std::vector<std::span<const float>> data;
  for (const SavedTensor& t : wanted) {
    data.push_back(r.tensor(t.name, t.numel));
    names.insert(t.name);
  }
  for (const std::string& n : r.names())
    if (!names.contains(n)) throw_runtime_error("{}: tensor {} is not part of this optimizer's state", file, n);

  for (std::size_t g = 0; g < x.groups.size(); ++g) opt.set_hyperparameters(g, x.groups[g]);
  for (std::size_t k = 0; k < wanted.size(); ++k) opt.write_state(wanted[k].param, wanted[k].kind, data[k]);
  opt.set_step_count(x.step_count);  // every parameter's too: a format 1 index has no other
  for (std::size_t p = 0; p < x.params.size(); ++p)
    if (x.params[p].step >= 0) opt.set_step_count(p, x.params[p].step);
  opt.set_schedule_index(x.schedule_index);
  if (x.loss_scaling) opt.set_loss_scaler_state(x.loss_scale, x.growth_tracker);
}

}  // namespace dos::checkpoint
