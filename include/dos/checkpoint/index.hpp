#pragma once
/// @file
/// @brief The checkpoint index (`index.json`): what was saved, by which dos, and where.
///
/// It names one safetensors file per rank. dos has no multi-rank support yet, so
/// `save` writes rank 0 only; the loader already reads every file the index names
/// and takes each tensor from whichever file holds it (a tensor in two files is an
/// error), so a sharded save can reuse this format unchanged.

#include "dos/checkpoint/file_io.hpp"
#include "dos/core/tensor.hpp"
#include "dos/optim/adam.hpp"
#include "dos/schedule/cost_model.hpp"
#include "dos/version.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dos::checkpoint {

/// @brief The index format this dos writes; it reads this version and older ones.
///        Version 2 added each parameter's own step count (`ParamInfo::step`); a
///        version 1 index has one count for all, `step_count`.
inline constexpr std::int64_t format_version = 2;
/// @brief The `format` field every index carries, to tell it from other JSON files.
inline constexpr std::string_view format_name = "dos-optimizer-checkpoint";
/// @brief The file name of the index inside a checkpoint directory.
inline constexpr std::string_view index_file_name = "index.json";

/// @brief One rank's safetensors file and the checksum of each tensor in it.
struct RankFile {
  std::int64_t rank = 0;
  std::string file;       ///< relative to the checkpoint directory
  std::uint64_t bytes = 0;  ///< the whole file's size
  std::map<std::string, std::string> checksums;  ///< tensor name -> "xxh64:<16 hex>"
};

/// @brief A parameter as the optimizer recorded it.
struct ParamInfo {
  std::uint64_t numel = 0;
  DType dtype = DType::f32;
  std::uint64_t group = 0;
  /// Steps this parameter took (torch's `state[p]["step"]`: steps it had no gradient at
  /// are not counted); -1 when the index does not say (format 1, or a writer that left
  /// it out): loading then gives the parameter `step_count`.
  std::int64_t step = -1;
};

/// @brief Everything in `index.json`.
struct CheckpointIndex {
  std::int64_t version = format_version;
  std::string dos_version;
  std::int64_t step_count = 0;
  std::int64_t schedule_index = 0;
  bool loss_scaling = false;  ///< whether the scaler state below is meaningful
  double loss_scale = 1;
  std::int64_t growth_tracker = 0;
  std::uint64_t subgroup_elements = 0;  ///< informative: loading reshards to any size
  std::vector<AdamConfig> groups;
  std::vector<ParamInfo> params;
  std::vector<RankFile> ranks;
  /// @brief What a device optimizer's cost model had learned of this machine (rates
  ///        refined by every step); absent for a host-only optimizer. Informative: a
  ///        resumed run passes it as `InterleaveOptions::profile` to start from it
  ///        instead of calibrating (`saved_hardware_profile`).
  std::optional<HardwareProfile> hardware_profile;
};

/// @brief The library version as "major.minor.patch".
inline std::string dos_version_string() {
  return fmt::format("{}.{}.{}", DOS_VERSION_MAJOR, DOS_VERSION_MINOR, DOS_VERSION_PATCH);
}

/// @brief The index as JSON text. Doubles are written in the shortest form that reads
///        back to the same bits, so hyperparameters and the loss scale round-trip.
inline std::string index_to_json(const CheckpointIndex& x) {
  nlohmann::ordered_json j;
  j["format"] = format_name;
  j["format_version"] = x.version;
  j["dos_version"] = x.dos_version;
  j["checksum"] = "xxh64";
  j["step_count"] = x.step_count;
  j["schedule_index"] = x.schedule_index;
  if (x.loss_scaling) j["loss_scaler"] = {{"scale", x.loss_scale}, {"growth_tracker", x.growth_tracker}};
  else j["loss_scaler"] = nullptr;
  j["subgroup_elements"] = x.subgroup_elements;
  j["param_groups"] = nlohmann::ordered_json::array();
  for (std::size_t g = 0; g < x.groups.size(); ++g) {
    const AdamConfig& c = x.groups[g];
    std::vector<std::uint64_t> members;
    for (std::size_t p = 0; p < x.params.size(); ++p)
      if (x.params[p].group == g) members.push_back(p);
    j["param_groups"].push_back({{"lr", c.lr}, {"betas", {c.beta1, c.beta2}}, {"eps", c.eps},
                                 {"weight_decay", c.weight_decay}, {"amsgrad", c.amsgrad}, {"maximize", c.maximize},
                                 {"decoupled_weight_decay", c.decoupled_weight_decay}, {"params", members}});
  }
  if (const auto& h = x.hardware_profile)
    j["hardware_profile"] = {{"cpu_rate", h->cpu_rate}, {"device_rate", h->device_rate}, {"h2d_bandwidth", h->h2d_bandwidth},
                             {"d2h_bandwidth", h->d2h_bandwidth}, {"duplex", h->duplex}, {"host_bandwidth", h->host_bandwidth}};
  j["params"] = nlohmann::ordered_json::array();
  for (const ParamInfo& p : x.params) {
    nlohmann::ordered_json e = {{"numel", p.numel}, {"dtype", dtype_name(p.dtype)}};
    if (p.step >= 0) e["step"] = p.step;
    j["params"].push_back(std::move(e));
  }
  j["ranks"] = nlohmann::ordered_json::array();
  for (const RankFile& r : x.ranks)
    j["ranks"].push_back({{"rank", r.rank}, {"file", r.file}, {"bytes", r.bytes}, {"tensors", r.checksums}});
  return j.dump(1);
}

namespace detail {

// Typed field access with errors that name the file and the field's path.
struct JsonReader {
  std::string_view file;

  const nlohmann::json& at(const nlohmann::json& j, std::string_view key, std::string_view where) const {
    if (!j.is_object()) throw_runtime_error("{}: {} is not an object", file, where);
    const auto it = j.find(key);
    if (it == j.end()) throw_runtime_error("{}: {} has no \"{}\"", file, where, key);
    return *it;
  }
  std::int64_t integer(const nlohmann::json& v, std::string_view what) const {
    if (!v.is_number_integer()) throw_runtime_error("{}: {} must be an integer, got {}", file, what, v.dump());
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      throw_runtime_error("{}: {} is out of range: {}", file, what, v.dump());
    return v.get<std::int64_t>();
  }
  std::uint64_t count(const nlohmann::json& v, std::string_view what) const {
    if (!v.is_number_unsigned()) throw_runtime_error("{}: {} must be a non-negative integer, got {}", file, what, v.dump());
    return v.get<std::uint64_t>();
  }
  double number(const nlohmann::json& v, std::string_view what) const {
    if (!v.is_number()) throw_runtime_error("{}: {} must be a number, got {}", file, what, v.dump());
    return v.get<double>();
  }
  bool boolean(const nlohmann::json& v, std::string_view what) const {
    if (!v.is_boolean()) throw_runtime_error("{}: {} must be true or false, got {}", file, what, v.dump());
    return v.get<bool>();
  }
  std::string string(const nlohmann::json& v, std::string_view what) const {
    if (!v.is_string()) throw_runtime_error("{}: {} must be a string, got {}", file, what, v.dump());
    return v.get<std::string>();
  }
};

inline DType parse_dtype(std::string_view s, std::string_view file, std::string_view what) {
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    if (s == dtype_name(t)) return t;
  throw_runtime_error("{}: {} is \"{}\", not float32, bfloat16 or float16", file, what, s);
}

}  // namespace detail

/// @brief Parses and checks `index.json` text.
/// @param text the file's contents.
/// @param file named in every error message.
/// @throws std::runtime_error for invalid JSON, a foreign or newer format, a missing
///         or mistyped field, or inconsistent groups, params or ranks.
inline CheckpointIndex parse_index(std::string_view text, std::string_view file) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) throw_runtime_error("{}: not valid JSON (truncated or corrupted index)", file);
  const detail::JsonReader r{file};
  if (!j.is_object() || !j.contains("format") || j["format"] != std::string(format_name))
    throw_runtime_error("{}: not a dos checkpoint index (\"format\" is not \"{}\")", file, format_name);
  CheckpointIndex x;
  x.version = r.integer(r.at(j, "format_version", "the index"), "format_version");
  if (x.version > format_version)
    throw_runtime_error("{}: format version {} is newer than this dos reads ({}); it was written by dos {}", file,
                        x.version, format_version,
                        j.contains("dos_version") && j["dos_version"].is_string() ? j["dos_version"].get<std::string>() : "?");
  if (x.version < 1) throw_runtime_error("{}: format version {} does not exist", file, x.version);
  if (r.string(r.at(j, "checksum", "the index"), "checksum") != "xxh64")
    throw_runtime_error("{}: unknown checksum algorithm {}", file, j["checksum"].dump());
  x.dos_version = r.string(r.at(j, "dos_version", "the index"), "dos_version");
  x.step_count = r.integer(r.at(j, "step_count", "the index"), "step_count");
  x.schedule_index = r.integer(r.at(j, "schedule_index", "the index"), "schedule_index");
  if (x.step_count < 0 || x.schedule_index < 0)
    throw_runtime_error("{}: step_count {} and schedule_index {} must be >= 0", file, x.step_count, x.schedule_index);
  const nlohmann::json& ls = r.at(j, "loss_scaler", "the index");
  if (!ls.is_null()) {
    x.loss_scaling = true;
    x.loss_scale = r.number(r.at(ls, "scale", "loss_scaler"), "loss_scaler.scale");
    x.growth_tracker = r.integer(r.at(ls, "growth_tracker", "loss_scaler"), "loss_scaler.growth_tracker");
  }
  x.subgroup_elements = r.count(r.at(j, "subgroup_elements", "the index"), "subgroup_elements");
  if (const auto it = j.find("hardware_profile"); it != j.end() && !it->is_null()) {
    HardwareProfile h;
    const auto rate = [&](const char* key) {
      const double v = r.number(r.at(*it, key, "hardware_profile"), std::string("hardware_profile.") + key);
      if (!(v >= 0) || !std::isfinite(v)) throw_runtime_error("{}: hardware_profile.{} must be finite and >= 0, got {}", file, key, v);
      return v;
    };
    h.cpu_rate = rate("cpu_rate");
    h.device_rate = rate("device_rate");
    h.h2d_bandwidth = rate("h2d_bandwidth");
    h.d2h_bandwidth = rate("d2h_bandwidth");
    h.duplex = r.boolean(r.at(*it, "duplex", "hardware_profile"), "hardware_profile.duplex");
    h.host_bandwidth = rate("host_bandwidth");
    x.hardware_profile = h;
  }

  const nlohmann::json& params = r.at(j, "params", "the index");
  if (!params.is_array()) throw_runtime_error("{}: params must be an array", file);
  for (std::size_t p = 0; p < params.size(); ++p) {
    const std::string where = fmt::format("params[{}]", p);
    ParamInfo info;
    info.numel = r.count(r.at(params[p], "numel", where), where + ".numel");
    info.dtype = detail::parse_dtype(r.string(r.at(params[p], "dtype", where), where + ".dtype"), file, where + ".dtype");
    info.group = UINT64_MAX;  // set from param_groups below
    if (params[p].contains("step")) {  // optional: without it, step_count (as in format 1)
      info.step = r.integer(r.at(params[p], "step", where), where + ".step");
      if (info.step < 0 || info.step == INT64_MAX) throw_runtime_error("{}: {}.step {} is out of range", file, where, info.step);
    }
    x.params.push_back(info);
  }
  const nlohmann::json& groups = r.at(j, "param_groups", "the index");
  if (!groups.is_array()) throw_runtime_error("{}: param_groups must be an array", file);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string where = fmt::format("param_groups[{}]", g);
    const nlohmann::json& v = groups[g];
    AdamConfig c;
    c.lr = r.number(r.at(v, "lr", where), where + ".lr");
    const nlohmann::json& betas = r.at(v, "betas", where);
    if (!betas.is_array() || betas.size() != 2) throw_runtime_error("{}: {}.betas must be two numbers", file, where);
    c.beta1 = r.number(betas[0], where + ".betas[0]");
    c.beta2 = r.number(betas[1], where + ".betas[1]");
    c.eps = r.number(r.at(v, "eps", where), where + ".eps");
    c.weight_decay = r.number(r.at(v, "weight_decay", where), where + ".weight_decay");
    c.amsgrad = r.boolean(r.at(v, "amsgrad", where), where + ".amsgrad");
    c.maximize = r.boolean(r.at(v, "maximize", where), where + ".maximize");
    c.decoupled_weight_decay = r.boolean(r.at(v, "decoupled_weight_decay", where), where + ".decoupled_weight_decay");
    const nlohmann::json& members = r.at(v, "params", where);
    if (!members.is_array()) throw_runtime_error("{}: {}.params must be an array", file, where);
    for (const nlohmann::json& m : members) {
      const std::uint64_t p = r.count(m, where + ".params[]");
      if (p >= x.params.size()) throw_runtime_error("{}: {} names parameter {}, but there are {}", file, where, p, x.params.size());
      if (x.params[p].group != UINT64_MAX) throw_runtime_error("{}: parameter {} is in two param_groups", file, p);
      x.params[p].group = g;
    }
    x.groups.push_back(c);
  }
  for (std::size_t p = 0; p < x.params.size(); ++p)
    if (x.params[p].group == UINT64_MAX) throw_runtime_error("{}: parameter {} is in no param_group", file, p);

  const nlohmann::json& ranks = r.at(j, "ranks", "the index");
  if (!ranks.is_array() || ranks.empty()) throw_runtime_error("{}: ranks must be a non-empty array", file);
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    const std::string where = fmt::format("ranks[{}]", k);
    RankFile f;
    f.rank = r.integer(r.at(ranks[k], "rank", where), where + ".rank");
    f.file = r.string(r.at(ranks[k], "file", where), where + ".file");
    // A file name, not a path: the index must not point outside its directory.
    if (f.file.empty() || f.file.find('/') != std::string::npos || f.file == "." || f.file == "..")
      throw_runtime_error("{}: {}.file \"{}\" is not a plain file name", file, where, f.file);
    f.bytes = r.count(r.at(ranks[k], "bytes", where), where + ".bytes");
    const nlohmann::json& t = r.at(ranks[k], "tensors", where);
    if (!t.is_object()) throw_runtime_error("{}: {}.tensors must be an object", file, where);
    for (auto it = t.begin(); it != t.end(); ++it)
      f.checksums[it.key()] = r.string(it.value(), where + ".tensors." + it.key());
    x.ranks.push_back(std::move(f));
  }
  return x;
}

}  // namespace dos::checkpoint
