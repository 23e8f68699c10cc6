// Exact resume: train k steps, save, load into a fresh optimizer (also in a new
// process), continue; values and state must be bit-identical to an uninterrupted run,
// for fp32, bf16 and fp16 parameters, amsgrad, loss scaling with an overflowing step,
// and a schedule, on the CPU backend and on the emulated device with resident
// subgroups. Also: resharding to other subgroup sizes, and the asynchronous save.

#include "support/checkpoint_run.hpp"

#include <doctest/doctest.h>
#include <dos/checkpoint.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

using namespace dos;
using test::full_state;
using test::Run;
using test::RunSpec;
using test::TempDir;

namespace {

constexpr std::int64_t kCalls = 10;

// The uninterrupted run's values and state after kCalls calls.
template <class Backend>
std::pair<std::vector<std::byte>, std::vector<float>> uninterrupted(const RunSpec& spec) {
  Run<Backend> r(spec);
  r.run_to(kCalls);
  return {r.values(), full_state(r.opt)};
}

// Resumes from @p dir with the values the framework saved, into a run of @p spec, and
// continues to kCalls calls. Returns whether it matches @p expected bit for bit.
// With @p values_first the framework restores its weights before building the
// optimizer (torch's usual order); otherwise after (the checkpoint's masters must then
// bring dos's own copies of device-resident values up to date).
template <class Backend>
bool resume_matches(const RunSpec& spec, const std::filesystem::path& dir, const std::vector<std::byte>& values,
                    const std::pair<std::vector<std::byte>, std::vector<float>>& expected, bool values_first = true) {
  Run<Backend> fresh(spec, values_first ? &values : nullptr);
  if (!values_first) fresh.set_values(values);
  load(fresh.opt, dir);
  fresh.run_to(kCalls);
  return fresh.values() == expected.first && test::same_bits(full_state(fresh.opt), expected.second);
}

template <class Backend>
void check_exact_resume(const RunSpec& spec) {
  const auto expected = uninterrupted<Backend>(spec);
  for (std::int64_t k : {1, 2, 3, 5, 9}) {  // call 3 is the overflow: a save right after a skipped step
    CAPTURE(k);
    TempDir dir("resume");
    Run<Backend> first(spec);
    first.run_to(k);
    save(first.opt, dir.path);
    CHECK(resume_matches<Backend>(spec, dir.path, first.values(), expected));
    // The run that saved continues undisturbed as well.
    first.run_to(kCalls);
    CHECK(first.values() == expected.first);
  }
}

}  // namespace

TEST_CASE("exact resume on the CPU backend: fp32, bf16, fp16, amsgrad, loss scaling, schedule") {
  check_exact_resume<CpuBackend>({.specs = test::mixed_specs(false)});
  check_exact_resume<CpuBackend>({.specs = test::mixed_specs(false), .loss_scaling = false, .schedule = false, .overflow_call = 0, .threads = 2});
}

TEST_CASE("exact resume on the emulated device with resident subgroups (static_fraction)") {
  const RunSpec spec{.specs = test::mixed_specs(true), .device = true};
  check_exact_resume<EmulatedDeviceBackend>(spec);
  // Weights restored after the optimizer was built: the saved masters of the
  // device-resident fp32 parameters bring dos's copies up to date.
  const auto expected = uninterrupted<EmulatedDeviceBackend>(spec);
  TempDir dir("late_values");
  Run<EmulatedDeviceBackend> first(spec);
  first.run_to(4);
  save(first.opt, dir.path);
  CHECK(checkpoint::CheckpointReader(dir.path).contains("state.2.master"));  // fp32 on the device
  CHECK(resume_matches<EmulatedDeviceBackend>(spec, dir.path, first.values(), expected, false));
  // And a device checkpoint loads into the all-host twin, where those masters are values.
  RunSpec host = spec;
  host.specs = test::mixed_specs(false);
  host.device = false;
  CHECK(resume_matches<CpuBackend>(host, dir.path, first.values(), expected));
}

TEST_CASE("a checkpoint resumes exactly in a new process") {
  const RunSpec spec{.specs = test::mixed_specs(false)};
  const auto expected = uninterrupted<CpuBackend>(spec);
  TempDir dir("process");
  Run<CpuBackend> first(spec);
  first.run_to(4);
  save(first.opt, dir.path);
  const std::vector<std::byte> values = first.values();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Only this thread exists in the child; it builds everything it uses anew.
    int code = 2;
    try {
      code = resume_matches<CpuBackend>(spec, dir.path, values, expected) ? 0 : 1;
    } catch (...) {
    }
    std::_Exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("resharding: a checkpoint loads into other subgroup sizes and backends with the same trajectory") {
  const RunSpec spec{.specs = test::mixed_specs(false), .subgroup = 64};
  const auto expected = uninterrupted<CpuBackend>(spec);
  TempDir dir("reshard");
  Run<CpuBackend> first(spec);
  first.run_to(5);
  save(first.opt, dir.path);
  for (std::size_t subgroup : {7u, 100u, 1000u, 100000u}) {
    CAPTURE(subgroup);
    RunSpec other = spec;
    other.subgroup = subgroup;
    Run<CpuBackend> probe(other);
    CHECK(probe.opt.subgroups().size() != first.opt.subgroups().size());
    CHECK(resume_matches<CpuBackend>(other, dir.path, first.values(), expected));
  }
  // Onto the emulated device (host tensors only, so the value bytes compare directly).
  RunSpec device = spec;
  device.device = true;
  device.subgroup = 150;
  CHECK(resume_matches<EmulatedDeviceBackend>(device, dir.path, first.values(), expected));
}

TEST_CASE("asynchronous save: later steps do not change what is written; buffers reused; errors on wait") {
  const RunSpec spec{.specs = test::mixed_specs(false)};
  const auto expected = uninterrupted<CpuBackend>(spec);
  TempDir dir("async");
  Run<CpuBackend> r(spec);
  AsyncCheckpointer ckpt;
  r.run_to(2);
  ckpt.save(r.opt, dir.path).wait();
  const float* buffer = ckpt.snapshot().data().data();
  const std::size_t capacity = ckpt.snapshot().capacity();

  r.run_to(5);
  const std::vector<std::byte> values = r.values();
  SaveHandle h = ckpt.save(r.opt, dir.path);
  r.run_to(8);  // training goes on while the file is written
  h.wait();
  CHECK(h.done());
  CHECK(ckpt.snapshot().data().data() == buffer);
  CHECK(ckpt.snapshot().capacity() == capacity);
  CHECK(resume_matches<CpuBackend>(spec, dir.path, values, expected));

  // A directory that cannot be created: the error comes back from wait().
  TempDir blocker("async_err");
  const auto file = blocker.path / "file";
  std::ofstream(file) << "x";
  SaveHandle bad = ckpt.save(r.opt, file / "ckpt");
  std::string what;
  try {
    bad.wait();
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  CHECK(what.rfind("dos: cannot create checkpoint directory", 0) == 0);
  CHECK(what.find((file / "ckpt").string()) != std::string::npos);
}

TEST_CASE("a state hold: step() waits for it, and a reader on another thread sees the state as it was") {
  const RunSpec spec{.specs = test::mixed_specs(false)};
  Run<CpuBackend> r(spec);
  r.run_to(3);
  const std::vector<float> before = full_state(r.opt);
  checkpoint::Snapshot sync;
  sync.capture(r.opt);
  StateHold hold = r.opt.hold_state();
  std::atomic<bool> stepped{false};
  std::jthread trainer([&] {
    r.run_to(4);  // the owner goes on: its step must wait for the hold
    stepped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(stepped.load());
  // Meanwhile the holder copies from its own thread.
  checkpoint::Snapshot s;
  s.prepare(r.opt);
  s.copy_held(r.opt, hold);
  CHECK_FALSE(stepped.load());
  CHECK(test::same_bits(std::vector<float>(s.data().begin(), s.data().end()),
                        std::vector<float>(sync.data().begin(), sync.data().end())));
  hold.release();
  trainer.join();
  CHECK(stepped.load());
  CHECK_FALSE(test::same_bits(full_state(r.opt), before));

  // A hold on another optimizer is refused by name; a released hold too.
  Run<CpuBackend> other(spec);
  StateHold foreign = other.opt.hold_state();
  std::vector<float> out(r.opt.param_numel(0));
  CHECK_THROWS_WITH_AS(r.opt.read_state(foreign, 0, StateKind::exp_avg, out), doctest::Contains("not a live hold on this optimizer"),
                       std::invalid_argument);
  foreign.release();
  CHECK_THROWS_AS(other.opt.read_state(foreign, 0, StateKind::exp_avg, out), std::invalid_argument);
}

TEST_CASE("the cost model's learned rates travel with a device optimizer's checkpoint") {
  const RunSpec spec{.specs = test::mixed_specs(true), .device = true};
  TempDir dir("profile");
  Run<EmulatedDeviceBackend> first(spec);
  first.run_to(4);
  save(first.opt, dir.path);
  const std::optional<HardwareProfile> saved = saved_hardware_profile(dir.path);
  REQUIRE(saved.has_value());
  const HardwareProfile& now = first.opt.cost_model().profile();
  const auto same = [](const HardwareProfile& a, const HardwareProfile& b) {
    return a.cpu_rate == b.cpu_rate && a.device_rate == b.device_rate && a.h2d_bandwidth == b.h2d_bandwidth &&
           a.d2h_bandwidth == b.d2h_bandwidth && a.duplex == b.duplex && a.host_bandwidth == b.host_bandwidth;
  };
  CHECK(same(*saved, now));  // every double round-trips through the JSON exactly
  // A resumed run starts from them instead of calibrating.
  Options o = Run<EmulatedDeviceBackend>::options(spec);
  o.interleave.profile = saved;
  test::MixedModel model = Run<EmulatedDeviceBackend>::make_model(spec, nullptr);
  InterleavedOptimizer<EmulatedDeviceBackend> resumed(model.groups(), o);
  CHECK(same(resumed.cost_model().profile(), now));

  // A host-only optimizer saves none; a lying profile is refused by name.
  TempDir host_dir("profile_host");
  Run<CpuBackend> host({.specs = test::mixed_specs(false)});
  host.run_to(1);
  save(host.opt, host_dir.path);
  CHECK_FALSE(saved_hardware_profile(host_dir.path).has_value());
  std::string text = checkpoint::index_to_json(checkpoint::CheckpointReader(dir.path).index());
  const auto at = text.find("\"cpu_rate\"");
  REQUIRE(at != std::string::npos);
  text.insert(text.find(':', at) + 2, "-");  // after ": "
  CHECK_THROWS_WITH_AS(checkpoint::parse_index(text, "index.json"),
                       doctest::Contains("index.json: hardware_profile.cpu_rate must be finite and >= 0"), std::runtime_error);
}
