// Step timelines: the overlap fraction, the one-line summary and the Chrome trace.

#include <doctest/doctest.h>
#include <dos/schedule/planner.hpp>
#include <dos/schedule/timeline.hpp>

#include <string>

using namespace dos;

namespace {
StepTimeline two_lanes() {
  StepTimeline t;
  t.plan.placement = {Place::cpu, Place::device};
  Op cpu;
  cpu.kind = OpKind::cpu_update;
  cpu.lane = Lane::cpu;
  cpu.elements = 10;
  Op up;
  up.kind = OpKind::upload;
  up.lane = Lane::h2d;
  up.subgroup = 1;
  up.bytes = 1000;
  Op down = up;
  down.kind = OpKind::download;
  down.lane = Lane::d2h;
  down.bytes = 500;
  t.plan.ops = {cpu, up, down};
  t.measured = {{0.0, 1.0}, {0.5, 1.5}, {1.5, 2.5}};  // transfers: 2 s, 0.5 s of it under the CPU
  t.predicted = {{0.0, 1.0}, {0.0, 1.0}, {1.0, 2.0}};
  t.measured_seconds = 2.5;
  t.predicted_seconds = 2.0;
  t.plan.stride = 2;
  t.policy = "fixed_stride";
  t.step = 7;
  return t;
}
}  // namespace

TEST_CASE("overlap fraction: transfer time hidden behind CPU updates") {
  StepTimeline t = two_lanes();
  CHECK(overlap_fraction(t) == doctest::Approx(0.25));
  t.measured = {{0.0, 3.0}, {0.5, 1.5}, {1.5, 2.5}};
  CHECK(overlap_fraction(t) == doctest::Approx(1.0));
  t.measured = {{3.0, 4.0}, {0.5, 1.5}, {1.5, 2.5}};
  CHECK(overlap_fraction(t) == doctest::Approx(0.0));
  CHECK(bytes_moved(t.plan) == 1500);
}

TEST_CASE("summary names the step, time, policy, k, bytes, overlap and an exploring step") {
  StepTimeline t = two_lanes();
  const std::string s = summary(t);
  CHECK(s.find("step 7") == 0);
  CHECK(s.find("2.5000 s") != std::string::npos);
  CHECK(s.find("fixed_stride k=2") != std::string::npos);
  CHECK(s.find("1/2 subgroups on the device") != std::string::npos);
  CHECK(s.find("25% of transfers overlapped") != std::string::npos);
  CHECK(s.find("explored") == std::string::npos);
  t.plan.explored = true;
  CHECK(summary(t).find("; explored") != std::string::npos);
  t.plan.fallback = "the staging budget is smaller than one subgroup's staging slot";
  CHECK(summary(t).find("fell back to the CPU: the staging budget") != std::string::npos);
}

TEST_CASE("the Chrome trace has both timelines, one event per op each, on named lanes") {
  const StepTimeline t = two_lanes();
  const std::string j = chrome_trace(t);
  const auto count = [&](const std::string& needle) {
    std::size_t n = 0;
    for (std::size_t at = j.find(needle); at != std::string::npos; at = j.find(needle, at + 1)) ++n;
    return n;
  };
  CHECK(count("\"ph\":\"X\"") == 6);
  CHECK(count("\"pid\":1,\"tid\":1,\"name\":\"upload s1\"") == 1);
  CHECK(count("\"pid\":2,\"tid\":1,\"name\":\"upload s1\",\"ts\":500000.000,\"dur\":1000000.000") == 1);
  CHECK(count("\"name\":\"thread_name\"") == 2 * lane_count);
  CHECK(count("{") == count("}"));
  CHECK(count("[") == count("]"));
  CHECK(j.find("\"displayTimeUnit\"") != std::string::npos);
  CHECK(j.find("explored") == std::string::npos);
  StepTimeline explored = t;
  explored.plan.explored = true;
  CHECK(chrome_trace(explored).find("measured (step 7, k=2, explored)") != std::string::npos);
}
