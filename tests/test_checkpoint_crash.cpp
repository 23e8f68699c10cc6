// Crash consistency: a child process saves a checkpoint over an existing one and is
// SIGKILLed at 20 random moments of the save. After each kill the directory must load
// (the previous checkpoint, or the new one if the kill came after its commit) and
// continue bit for bit as the uninterrupted run.

#include "support/checkpoint_run.hpp"

#include <doctest/doctest.h>
#include <dos/checkpoint.hpp>

#include <chrono>
#include <random>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace dos;
using test::full_state;
using test::Run;
using test::RunSpec;
using test::TempDir;

TEST_CASE("SIGKILL at 20 random moments of a save: the directory always loads and resumes exactly") {
  // About 3.5M state floats (14 MB): a save takes long enough to be hit in the middle.
  const RunSpec spec{.specs = test::mixed_specs(false, 2000), .subgroup = 1 << 16};
  constexpr std::int64_t kOld = 3, kNew = 5, kEnd = 7;
  Run<CpuBackend> reference(spec);
  reference.run_to(kOld);
  const auto old_values = reference.values();
  reference.run_to(kNew);
  const auto new_values = reference.values();
  reference.run_to(kEnd);
  const auto end_values = reference.values();
  const auto end_state = full_state(reference.opt);

  TempDir dir("crash");
  Run<CpuBackend> saver(spec);
  saver.run_to(kOld);
  save(saver.opt, dir.path);
  saver.run_to(kNew);
  // How long a whole save takes here, to spread the kills over it.
  TempDir timing("crash_timing");
  const auto t0 = std::chrono::steady_clock::now();
  save(saver.opt, timing.path);
  const double save_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("one save: " << save_seconds * 1e3 << " ms");

  std::mt19937_64 rng(std::random_device{}());
  int saw_old = 0, saw_new = 0;
  for (int i = 0; i < 20; ++i) {
    const auto delay = std::chrono::duration<double>(std::uniform_real_distribution<double>(0, 1.2 * save_seconds)(rng));
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        save(saver.opt, dir.path);
      } catch (...) {
        std::_Exit(1);
      }
      std::_Exit(0);
    }
    std::this_thread::sleep_for(delay);
    ::kill(child, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CAPTURE(i);
    CAPTURE(delay.count());
    Run<CpuBackend> fresh(spec);
    const checkpoint::CheckpointReader r(dir.path);
    const std::int64_t calls = r.index().schedule_index;
    REQUIRE((calls == kOld || calls == kNew));
    (calls == kOld ? saw_old : saw_new)++;
    fresh.set_values(calls == kOld ? old_values : new_values);
    load(fresh.opt, dir.path);
    fresh.run_to(kEnd);
    CHECK(fresh.values() == end_values);
    CHECK(test::same_bits(full_state(fresh.opt), end_state));
    if (calls == kNew) {  // put the old checkpoint back for the next kill
      Run<CpuBackend> old(spec);
      old.run_to(kOld);
      save(old.opt, dir.path);
    }
  }
  MESSAGE("kills before the commit: " << saw_old << ", after: " << saw_new);
  // A completed save afterwards cleans up what interrupted ones left behind.
  save(saver.opt, dir.path);
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    (void)e;
    ++files;
  }
  CHECK(files == 2);
}
