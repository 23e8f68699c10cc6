// Checkpoint format and validation: XXH64 against its published vectors, the
// safetensors header (round trip, every lie it can tell, a fuzzer), and loads of
// broken checkpoints, each of which must throw a clear error naming the file and the
// tensor and leave the optimizer as it was.

#include "support/checkpoint_run.hpp"

#include <doctest/doctest.h>
#include <dos/checkpoint.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <string>

using namespace dos;
using namespace dos::checkpoint;
using test::Run;
using test::RunSpec;
using test::TempDir;

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_file(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// A saved 3-step CPU run, and helpers to break its files.
struct Saved {
  TempDir dir{"fmt"};
  RunSpec spec{.specs = test::mixed_specs(false)};
  Run<CpuBackend> run{spec};
  Saved() {
    run.run_to(3);
    save(run.opt, dir.path);
  }
  std::filesystem::path index() const { return dir.path / "index.json"; }
  nlohmann::json index_json() const { return nlohmann::json::parse(read_file(index())); }
  std::filesystem::path rank_file() const { return dir.path / index_json()["ranks"][0]["file"].get<std::string>(); }
  // Rewrites the rank file's header with @p edit (data unchanged) and the index's size.
  template <class F>
  void edit_header(F&& edit) {
    const std::string bytes = read_file(rank_file());
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    nlohmann::ordered_json h = nlohmann::ordered_json::parse(bytes.substr(8, n));
    edit(h);
    std::string json = h.dump();
    json.append((8 - json.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    const std::uint64_t m = json.size();
    std::memcpy(out.data(), &m, 8);
    out += json + bytes.substr(8 + n);
    write_file(rank_file(), out);
    nlohmann::json x = index_json();
    x["ranks"][0]["bytes"] = out.size();
    write_file(index(), x.dump());
  }
};

// Loads @p dir into a fresh optimizer of the same model trained 1 step, and checks it
// throws @p E with every fragment of @p needles, and changes nothing.
template <class E>
void expect_load_error(const std::filesystem::path& dir, std::initializer_list<std::string> needles,
                       RunSpec spec = {.specs = test::mixed_specs(false)}) {
  Run<CpuBackend> fresh(spec);
  fresh.run_to(1);
  const auto before = test::full_state(fresh.opt);
  const auto values = fresh.values();
  std::string what;
  CHECK_THROWS_AS(
      [&] {
        try {
          load(fresh.opt, dir);
        } catch (const std::exception& e) {
          what = e.what();
          throw;
        }
      }(),
      E);
  INFO(what);
  CHECK(what.rfind("dos: ", 0) == 0);
  for (const std::string& n : needles) CHECK(what.find(n) != std::string::npos);
  CHECK(test::same_bits(before, test::full_state(fresh.opt)));
  CHECK(values == fresh.values());
}

}  // namespace

TEST_CASE("xxh64 matches the published test vectors") {
  CHECK(xxh64("", 0) == 0xEF46DB3751D8E999ull);
  CHECK(xxh64("a", 1) == 0xD24EC4F1A98C6E5Bull);
  CHECK(xxh64("abc", 3) == 0x44BC2CF5AD770999ull);
  const std::string s = "Nobody inspects the spammish repetition";  // 39 bytes: every tail path
  CHECK(xxh64(s.data(), s.size()) == 0xFBCEA83C8A378BF1ull);
  CHECK(checksum_string(0xFBCEA83C8A378BF1ull) == "xxh64:fbcea83c8a378bf1");
  // Every byte and length matters, and unaligned input reads the same bytes.
  std::string big(1000, 'x');
  const auto h = xxh64(big.data(), big.size());
  big[517] ^= 1;
  CHECK(xxh64(big.data(), big.size()) != h);
  big[517] ^= 1;
  CHECK(xxh64(big.data(), 999) != h);
  std::string shifted = " " + big;
  CHECK(xxh64(shifted.data() + 1, big.size()) == h);
}

TEST_CASE("safetensors header: round trip, 8-byte aligned data, and each lie named") {
  const std::vector<TensorEntry> t{{"state.0.exp_avg", "F32", {3}, 0, 12}, {"b", "BF16", {2, 2}, 12, 20}};
  const std::string head = make_safetensors_header(t, {{"format", "dos"}});
  CHECK(head.size() % 8 == 0);
  const SafetensorsHeader h = parse_safetensors_header(head, head.size() + 20, "f");
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.data_start == head.size());
  CHECK(h.metadata.at("format") == "dos");
  const auto lie = [&](std::vector<TensorEntry> entries, std::uint64_t data, std::string needle) {
    const std::string bad = make_safetensors_header(entries, {});
    const std::string m = message_of([&] { parse_safetensors_header(bad, bad.size() + data, "the.file"); });
    INFO(m);
    CHECK(m.find("dos: the.file: ") == 0);
    CHECK(m.find(needle) != std::string::npos);
  };
  lie({{"x", "F32", {3}, 0, 12}}, 8, "tensor x: data_offsets end at 12 but the file holds 8 data bytes");
  lie({{"x", "F32", {4}, 0, 12}}, 12, "tensor x: shape [4] of F32 needs 16 bytes but data_offsets span 12");
  lie({{"x", "F32", {3}, 12, 0}}, 12, "tensor x: data_offsets [12, 0] are reversed");
  lie({{"x", "F32", {2}, 0, 8}, {"y", "F32", {2}, 4, 12}}, 12, "tensor y: data_offsets [4, 12] overlap tensor x's [0, 8]");
  lie({{"x", "Q7", {2}, 0, 8}}, 8, "tensor x: unknown dtype \"Q7\"");
  lie({{"x", "F32", {1ull << 62, 1ull << 62}, 0, 8}}, 8, "tensor x: shape [4611686018427387904,4611686018427387904] overflows");
  // A length past the file, and JSON that is not a header.
  std::string longer = head;
  const std::uint64_t huge = head.size() + 100;
  std::memcpy(longer.data(), &huge, 8);
  CHECK(message_of([&] { parse_safetensors_header(longer, longer.size(), "f"); }).find("truncated") != std::string::npos);
  std::string not_json(8, '\0');
  const std::uint64_t four = 4;
  std::memcpy(not_json.data(), &four, 8);
  not_json += "{\"a\"";
  CHECK(message_of([&] { parse_safetensors_header(not_json, not_json.size(), "f"); }) ==
        "dos: f: the safetensors header is not valid JSON");
}

TEST_CASE("fuzz: random and mutated headers never crash the parser") {
  test::Rng rng(42);
  const std::string seed_header = make_safetensors_header(
      {{"state.0.exp_avg", "F32", {3}, 0, 12}, {"state.0.exp_avg_sq", "F32", {3}, 12, 24}, {"m", "F16", {1, 2}, 24, 28}},
      {{"format", "dos"}});
  const std::string alphabet = "{}[]\",:0123456789-eE.truefalsnF32BF16dtypeshapedata_offsets __metadata__\\u\x01\xff";
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string s = seed_header;
    const std::size_t mode = rng.below(4);
    if (mode == 0) {  // flip bytes anywhere, the length included
      for (std::size_t k = 0, n = 1 + rng.below(6); k < n; ++k) s[rng.below(s.size())] ^= static_cast<char>(1 + rng.below(255));
    } else if (mode == 1) {  // replace bytes of the JSON by grammar-ish ones
      for (std::size_t k = 0, n = 1 + rng.below(8); k < n; ++k)
        s[8 + rng.below(s.size() - 8)] = alphabet[rng.below(alphabet.size())];
    } else if (mode == 2) {  // truncate or extend, keeping the claimed length
      s.resize(rng.below(s.size() + 16), ' ');
    } else {  // random text behind a plausible length
      std::string json(rng.below(200), ' ');
      for (char& c : json) c = alphabet[rng.below(alphabet.size())];
      s.assign(8, '\0');
      const std::uint64_t n = json.size();
      std::memcpy(s.data(), &n, 8);
      s += json;
    }
    const std::uint64_t file_size = s.size() + rng.below(64);
    try {
      const SafetensorsHeader h = parse_safetensors_header(s, file_size, "fuzz");
      for (const TensorEntry& t : h.tensors) REQUIRE(t.end <= file_size - h.data_start);
      ++accepted;
    } catch (const std::runtime_error& e) {
      REQUIRE(std::string(e.what()).rfind("dos: fuzz: ", 0) == 0);
      ++rejected;
    }
  }
  MESSAGE("accepted " << accepted << ", rejected " << rejected);
  CHECK(rejected > 1000);
  CHECK(accepted > 10);
}

TEST_CASE("the saved files: torch's state_dict names, an index naming them, nothing left behind") {
  Saved s;
  const nlohmann::json x = s.index_json();
  CHECK(x["format"] == "dos-optimizer-checkpoint");
  CHECK(x["format_version"] == 2);
  CHECK(x["params"][0]["step"] == 2);  // each parameter's own count (format 2)
  CHECK(x["step_count"] == 2);  // call 3 overflowed
  CHECK(x["schedule_index"] == 3);
  CHECK(x["loss_scaler"]["scale"] == 512.0);
  CHECK(x["subgroup_elements"] == 64);
  CHECK(x["param_groups"][1]["amsgrad"] == true);
  CHECK(x["ranks"].size() == 1);
  const auto& sums = x["ranks"][0]["tensors"];
  CHECK(sums.contains("state.0.exp_avg"));
  CHECK(!sums.contains("state.0.master"));  // fp32: the value is the master
  CHECK(sums.contains("state.1.master"));   // bf16
  CHECK(!sums.contains("state.0.max_exp_avg_sq"));
  CHECK(sums.contains("state.4.max_exp_avg_sq"));  // optimizer order: group 0's tensors, then group 1's (amsgrad)
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(s.dir.path)) {
    (void)e;
    ++files;
  }
  save(s.run.opt, s.dir.path);  // a second save replaces the first
  std::size_t after = 0;
  for (const auto& e : std::filesystem::directory_iterator(s.dir.path)) {
    (void)e;
    ++after;
  }
  CHECK(files == 2);
  CHECK(after == 2);
}

TEST_CASE("per-parameter step counts: saved (format 2), restored, and a format 1 index still loads") {
  TempDir dir{"steps"};
  RunSpec spec{.specs = test::mixed_specs(false), .overflow_call = 0};
  Run<CpuBackend> a(spec);
  // Parameters 2 and 5 have no gradient at some steps (torch's None): their counts lag.
  for (std::int64_t call = 1; call <= 4; ++call) {
    a.model.set_gradients(call);
    a.model.set_absent(2, call % 2 == 0);
    a.model.set_absent(5, call != 3);
    a.opt.step();
  }
  a.model.set_absent(2, false);
  a.model.set_absent(5, false);
  std::vector<std::int64_t> counts;
  for (std::size_t p = 0; p < a.opt.num_params(); ++p) counts.push_back(a.opt.step_count(p));
  CHECK(counts != std::vector<std::int64_t>(counts.size(), 4));
  save(a.opt, dir.path);
  const nlohmann::json x = nlohmann::json::parse(read_file(dir.path / "index.json"));
  for (std::size_t p = 0; p < counts.size(); ++p) CHECK(x["params"][p]["step"] == counts[p]);

  const auto values = a.values();
  Run<CpuBackend> b(spec, &values);
  load(b.opt, dir.path);
  CHECK(test::same_bits(test::full_state(a.opt), test::full_state(b.opt)));
  a.run_to(8);
  b.run_to(8);
  CHECK(test::same_bits(test::full_state(a.opt), test::full_state(b.opt)));
  CHECK(a.values() == b.values());

  // Format 1: no per-parameter steps; every parameter takes step_count.
  nlohmann::json old = x;
  old["format_version"] = 1;
  for (auto& e : old["params"]) e.erase("step");
  write_file(dir.path / "index.json", old.dump());
  Run<CpuBackend> c(spec);
  load(c.opt, dir.path);
  for (std::size_t p = 0; p < c.opt.num_params(); ++p) CHECK(c.opt.step_count(p) == x["step_count"].get<std::int64_t>());
}

TEST_CASE("broken checkpoints: a clear error naming the file and tensor, the optimizer untouched") {
  SUBCASE("no checkpoint") { expect_load_error<std::runtime_error>("/nonexistent/dos", {"no checkpoint index"}); }
  SUBCASE("truncated rank file") {
    Saved s;
    const std::string b = read_file(s.rank_file());
    write_file(s.rank_file(), b.substr(0, b.size() - 100));
    expect_load_error<std::runtime_error>(s.dir.path, {s.rank_file().string(), "truncated"});
  }
  SUBCASE("truncated index") {
    Saved s;
    const std::string b = read_file(s.index());
    write_file(s.index(), b.substr(0, b.size() / 2));
    expect_load_error<std::runtime_error>(s.dir.path, {"index.json", "not valid JSON"});
  }
  SUBCASE("a flipped byte in a tensor") {
    Saved s;
    std::string b = read_file(s.rank_file());
    b[b.size() - 5] ^= 0x10;  // in the last tensor's data
    write_file(s.rank_file(), b);
    expect_load_error<std::runtime_error>(s.dir.path, {s.rank_file().string(), "tensor state.6.", "checksum", "corrupted"});
  }
  SUBCASE("a header whose offsets lie") {
    Saved s;
    s.edit_header([](auto& h) { h["state.3.exp_avg"]["data_offsets"][1] = h["state.3.exp_avg"]["data_offsets"][1].template get<std::uint64_t>() + 4; });
    expect_load_error<std::runtime_error>(s.dir.path, {s.rank_file().string(), "tensor state.3.exp_avg"});
  }
  SUBCASE("a header whose sizes lie") {
    Saved s;
    s.edit_header([](auto& h) { h["state.1.exp_avg_sq"]["shape"][0] = 149; });
    expect_load_error<std::runtime_error>(s.dir.path, {s.rank_file().string(), "tensor state.1.exp_avg_sq", "needs 596 bytes"});
  }
  SUBCASE("a header claiming data past the end") {
    Saved s;
    s.edit_header([](auto& h) { h["state.0.exp_avg"]["data_offsets"] = {1ull << 40, (1ull << 40) + 148}; });
    expect_load_error<std::runtime_error>(s.dir.path, {"tensor state.0.exp_avg", "data_offsets end at"});
  }
  SUBCASE("a missing tensor") {
    Saved s;
    s.edit_header([](auto& h) { h.erase("state.4.exp_avg_sq"); });
    expect_load_error<std::runtime_error>(s.dir.path, {"tensor state.4.exp_avg_sq is missing"});
  }
  SUBCASE("a checkpoint of a different model") {
    Saved s;
    RunSpec other{.specs = test::mixed_specs(false)};
    other.specs[2].numel += 1;
    expect_load_error<std::invalid_argument>(s.dir.path, {"index.json", "parameter 4 has 90 elements in the checkpoint, 91"}, other);
    other = {.specs = test::mixed_specs(false)};
    other.specs.pop_back();
    expect_load_error<std::invalid_argument>(s.dir.path, {"holds 7 parameters, this optimizer 6"}, other);
    other = {.specs = test::mixed_specs(false)};
    other.specs[1].dtype = DType::f16;
    expect_load_error<std::invalid_argument>(s.dir.path, {"parameter 1 is bfloat16 in the checkpoint, float16"}, other);
    other = {.specs = test::mixed_specs(false), .loss_scaling = false};
    expect_load_error<std::invalid_argument>(s.dir.path, {"saved with loss scaling"}, other);
  }
  SUBCASE("a newer format version") {
    Saved s;
    nlohmann::json x = s.index_json();
    x["format_version"] = 3;
    write_file(s.index(), x.dump());
    expect_load_error<std::runtime_error>(s.dir.path, {"index.json", "format version 3 is newer than this dos reads (2)"});
  }
  SUBCASE("a per-parameter step out of range") {
    Saved s;
    nlohmann::json x = s.index_json();
    x["params"][1]["step"] = -3;
    write_file(s.index(), x.dump());
    expect_load_error<std::runtime_error>(s.dir.path, {"index.json", "params[1].step -3 is out of range"});
  }
  SUBCASE("an index with a wrong field type or invalid hyperparameters") {
    Saved s;
    nlohmann::json x = s.index_json();
    x["step_count"] = "three";
    write_file(s.index(), x.dump());
    expect_load_error<std::runtime_error>(s.dir.path, {"index.json", "step_count must be an integer"});
    x = s.index_json();
    x["step_count"] = 2;
    x["param_groups"][0]["betas"][1] = 1.5;
    write_file(s.index(), x.dump());
    expect_load_error<std::runtime_error>(s.dir.path, {"index.json", "parameter group 0: beta2 must be in [0, 1), got 1.5"});
  }
  SUBCASE("an index pointing outside its directory") {
    Saved s;
    nlohmann::json x = s.index_json();
    x["ranks"][0]["file"] = "../elsewhere.safetensors";
    write_file(s.index(), x.dump());
    expect_load_error<std::runtime_error>(s.dir.path, {"is not a plain file name"});
  }
}
