#pragma once
/// @file
/// @brief The safetensors layout (huggingface.co/docs/safetensors): an 8-byte
///        little-endian header length N, N bytes of JSON
///        `{"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
///        "__metadata__": {string: string}}`, then the tensor bytes, offsets relative
///        to the end of the header. This header writes and strictly parses it.

#include "dos/checkpoint/file_io.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dos::checkpoint {

/// @brief One tensor of a safetensors file.
struct TensorEntry {
  std::string name;
  std::string dtype;                 ///< "F32", "F16", "BF16", ...
  std::vector<std::uint64_t> shape;  ///< empty for a scalar
  std::uint64_t begin = 0, end = 0;  ///< byte offsets relative to the data start
};

/// @brief A parsed header: the tensors (in file order) and the metadata.
struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  ///< 8 + N: where offset 0 of the data lies in the file
};

/// @brief Header lengths above this are refused (the safetensors reference limit), so
///        a lying length cannot make the reader allocate without bound.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

/// @brief Bytes per element of a safetensors dtype name; 0 for an unknown one.
inline std::size_t safetensors_dtype_size(std::string_view d) noexcept {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

/// @brief The first 8 + N bytes of a file holding @p tensors, whose offsets must be
///        laid out already. The JSON is padded with spaces so the data starts on an
///        8-byte boundary (as the reference writer does), which keeps every F32
///        tensor of a mapped file aligned.
inline std::string make_safetensors_header(const std::vector<TensorEntry>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  for (const TensorEntry& t : tensors)
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  std::string json = j.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

namespace detail {
inline std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}
}  // namespace detail

/// @brief Parses and checks the header of a safetensors file.
/// @param head the file's first bytes (at least the 8-byte length and the JSON).
/// @param file_size the file's size in bytes, which every offset must fit.
/// @param file named in every error message.
/// @throws std::runtime_error naming the file (and the tensor, where one is at fault)
///         for: a length past the file or the limit, invalid JSON, a non-object, a
///         wrong field type, an unknown dtype, a negative or overflowing shape,
///         offsets out of order, past the data, not matching the shape, or
///         overlapping another tensor's.
inline SafetensorsHeader parse_safetensors_header(std::string_view head, std::uint64_t file_size, std::string_view file) {
  if (head.size() < 8 || file_size < 8)
    throw_runtime_error("{}: truncated: {} bytes, shorter than the 8-byte safetensors header length", file, file_size);
  std::uint64_t n = 0;
  std::memcpy(&n, head.data(), 8);
  if (n > max_header_bytes) throw_runtime_error("{}: header length {} exceeds the limit of {} bytes", file, n, max_header_bytes);
  if (n > file_size - 8) throw_runtime_error("{}: truncated: the header claims {} bytes but the file has {} after the length", file, n, file_size - 8);
  if (head.size() < 8 + n) throw_runtime_error("{}: only {} of the header's {} bytes were read", file, head.size() - 8, n);
  SafetensorsHeader h;
  h.data_start = 8 + n;
  const std::uint64_t data_bytes = file_size - h.data_start;
  nlohmann::json j = nlohmann::json::parse(head.substr(8, n), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw_runtime_error("{}: the safetensors header is not valid JSON", file);
  if (!j.is_object()) throw_runtime_error("{}: the safetensors header is not a JSON object", file);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw_runtime_error("{}: __metadata__ is not an object of strings", file);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw_runtime_error("{}: __metadata__ entry \"{}\" is not a string", file, m.key());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) throw_runtime_error("{}: tensor {}: its entry is not an object", file, name);
    TensorEntry t;
    t.name = name;
    const auto dtype = v.find("dtype");
    const auto shape = v.find("shape");
    const auto offsets = v.find("data_offsets");
    if (dtype == v.end() || !dtype->is_string()) throw_runtime_error("{}: tensor {}: dtype is missing or not a string", file, name);
    t.dtype = dtype->get<std::string>();
    const std::size_t elem = safetensors_dtype_size(t.dtype);
    if (elem == 0) throw_runtime_error("{}: tensor {}: unknown dtype \"{}\"", file, name, t.dtype);
    if (shape == v.end() || !shape->is_array()) throw_runtime_error("{}: tensor {}: shape is missing or not an array", file, name);
    std::uint64_t count = 1;
    for (const nlohmann::json& d : *shape) {
      if (!d.is_number_unsigned()) throw_runtime_error("{}: tensor {}: shape holds {}, not a non-negative integer", file, name, d.dump());
      t.shape.push_back(d.get<std::uint64_t>());
      const auto c = detail::checked_mul(count, t.shape.back());
      if (!c) throw_runtime_error("{}: tensor {}: shape {} overflows", file, name, shape->dump());
      count = *c;
    }
    if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
        !(*offsets)[1].is_number_unsigned())
      throw_runtime_error("{}: tensor {}: data_offsets must be two non-negative integers", file, name);
    t.begin = (*offsets)[0].get<std::uint64_t>();
    t.end = (*offsets)[1].get<std::uint64_t>();
    if (t.begin > t.end) throw_runtime_error("{}: tensor {}: data_offsets [{}, {}] are reversed", file, name, t.begin, t.end);
    if (t.end > data_bytes)
      throw_runtime_error("{}: tensor {}: data_offsets end at {} but the file holds {} data bytes (truncated?)", file, name,
                          t.end, data_bytes);
    const auto bytes = detail::checked_mul(count, elem);
    if (!bytes || *bytes != t.end - t.begin)
      throw_runtime_error("{}: tensor {}: shape {} of {} needs {} bytes but data_offsets span {}", file, name,
                          shape->dump(), t.dtype, bytes ? fmt::to_string(*bytes) : std::string("too many"), t.end - t.begin);
    h.tensors.push_back(std::move(t));
  }
  // Tensors may not share bytes: a header that overlaps them lies about its layout.
  std::vector<const TensorEntry*> order;
  for (const TensorEntry& t : h.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  const TensorEntry* reach = nullptr;  // the tensor reaching furthest so far
  for (const TensorEntry* t : order) {
    if (reach != nullptr && t->begin < reach->end && t->begin != t->end)
      throw_runtime_error("{}: tensor {}: data_offsets [{}, {}] overlap tensor {}'s [{}, {}]", file, t->name, t->begin,
                          t->end, reach->name, reach->begin, reach->end);
    if (reach == nullptr || t->end > reach->end) reach = t;
  }
  return h;
}

}  // namespace dos::checkpoint
