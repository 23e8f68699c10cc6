// The overlap planner and the plan validator: properties over random subgroup lists,
// assignments and budgets; hand-broken plans the validator must reject.

#include "support/inputs.hpp"

#include <doctest/doctest.h>
#include <dos/schedule/planner.hpp>
#include <dos/schedule/policy.hpp>
#include <dos/schedule/validator.hpp>

#include <string>
#include <vector>

using namespace dos;

namespace {

std::vector<SubgroupShape> random_shapes(test::Rng& rng, std::size_t n) {
  std::vector<SubgroupShape> out(n);
  for (SubgroupShape& s : out) {
    s.elements = 1 + rng.below(1000);
    s.slot_bytes = 16 * s.elements + rng.below(2) * 4 * s.elements;
    s.upload_bytes = s.download_bytes = 12 * s.elements;
    s.resident_upload_bytes = rng.below(2) * 4 * s.elements;
    s.resident_download_bytes = rng.below(2) * 2 * s.elements;
    s.fetch_bytes = rng.below(2) * 2 * s.elements;
    s.push_bytes = s.fetch_bytes;
    s.cpu_bytes = 28 * s.elements;
  }
  return out;
}

std::string error_of(const Plan& p) { return find_plan_error(p).value_or(""); }

Plan simple_plan(std::uint32_t k, std::size_t n = 6, std::size_t slots = 2) {
  std::vector<SubgroupShape> shapes(n, SubgroupShape{.elements = 100, .slot_bytes = 1600, .upload_bytes = 1200,
                                                     .download_bytes = 1200, .fetch_bytes = 200, .push_bytes = 200,
                                                     .cpu_bytes = 2800});
  std::vector<Place> a;
  stride_assignment(a, n, k);
  Plan p;
  make_plan(p, shapes, a, {.budget = slots * 1600, .max_slots = slots}, k);
  return p;
}

std::uint32_t find(const Plan& p, OpKind kind, std::uint32_t subgroup) {
  for (std::uint32_t i = 0; i < p.ops.size(); ++i)
    if (p.ops[i].kind == kind && p.ops[i].subgroup == subgroup) return i;
  FAIL("no such op");
  return 0;
}

}  // namespace

TEST_CASE("property: every plan of random subgroups, assignments and budgets is valid") {
  test::Rng rng(42);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t n = 1 + rng.below(40);
    const auto shapes = random_shapes(rng, n);
    std::vector<Place> a(n);
    for (Place& p : a) p = static_cast<Place>(rng.below(3));
    std::size_t biggest = 0;
    for (std::size_t s = 0; s < n; ++s)
      if (a[s] == Place::device) biggest = std::max(biggest, shapes[s].slot_bytes);
    const PlanLimits limits{.budget = rng.below(4 * biggest + 2), .max_slots = rng.below(5)};
    Plan plan;
    make_plan(plan, shapes, a, limits);
    CAPTURE(trial);
    INFO(error_of(plan));
    REQUIRE_FALSE(find_plan_error(plan).has_value());
    // Every subgroup is updated exactly once, where the plan places it.
    std::vector<int> updates(n, 0);
    for (const Op& op : plan.ops)
      if (op.kind == OpKind::cpu_update || op.kind == OpKind::device_update) ++updates[op.subgroup];
    for (std::size_t s = 0; s < n; ++s) REQUIRE(updates[s] == 1);
    // Residents stay; streamed ones fall back only when no slot fits.
    for (std::size_t s = 0; s < n; ++s) {
      if (a[s] == Place::resident) REQUIRE(plan.placement[s] == Place::resident);
      if (a[s] == Place::device) REQUIRE(plan.placement[s] == (plan.fallback.empty() ? Place::device : Place::cpu));
    }
    REQUIRE(plan.staging_bytes() <= limits.budget);
    if (limits.max_slots != 0) REQUIRE(plan.slots <= limits.max_slots);
    REQUIRE(plan.fallback.empty() == (biggest == 0 || limits.budget >= biggest));
  }
}

TEST_CASE("k-stride plans put ceil(n / k) subgroups on the device and pipeline them") {
  for (std::uint32_t k = 1; k <= 8; ++k)
    for (std::size_t n = 1; n <= 17; ++n) {
      const Plan p = simple_plan(k, n);
      CHECK(p.device_subgroups() == (n + k - 1) / k);
      CHECK_FALSE(find_plan_error(p).has_value());
    }
  // With two slots the third upload waits for the first download.
  const Plan p = simple_plan(1, 3);
  const Op& third = p.ops[find(p, OpKind::upload, 2)];
  REQUIRE(third.dep_count == 1);
  CHECK(p.ops[third.deps[0].op].kind == OpKind::download);
  CHECK(p.ops[third.deps[0].op].subgroup == 0);
  CHECK(third.deps[0].event);
}

TEST_CASE("the validator rejects a subgroup updated twice or never") {
  Plan p = simple_plan(2);
  Op twice = p.ops[find(p, OpKind::cpu_update, 1)];
  p.ops.push_back(twice);
  CHECK(error_of(p).find("subgroup 1 is updated twice") != std::string::npos);

  p = simple_plan(2);
  REQUIRE(p.ops.back().kind == OpKind::push_params);
  p.ops.pop_back();  // subgroup 5's push, then its update: the last two ops
  REQUIRE(p.ops.back().kind == OpKind::cpu_update);
  REQUIRE(p.ops.back().subgroup == 5);
  p.ops.pop_back();
  CHECK(error_of(p).find("subgroup 5 is never updated") != std::string::npos);
}

TEST_CASE("the validator rejects a device update that is never written back (trap 5.2)") {
  Plan p = simple_plan(2, 6);
  p.ops.erase(p.ops.begin() + find(p, OpKind::download, 4));
  // later ops' dependency indices shift; rebuild them by removing dependants on it
  for (Op& op : p.ops)
    for (std::uint8_t d = 0; d < op.dep_count; ++d)
      if (op.deps[d].op >= find(p, OpKind::device_update, 4) + 1) --op.deps[d].op;
  CHECK(error_of(p).find("never written back") != std::string::npos);
}

TEST_CASE("the validator rejects a cross-stream dependency without an event (trap 5.3)") {
  Plan p = simple_plan(2);
  Op& update = p.ops[find(p, OpKind::device_update, 0)];
  update.deps[0].event = false;
  CHECK(error_of(p).find("on another stream without an event") != std::string::npos);

  p = simple_plan(2);
  p.ops[find(p, OpKind::upload, 0)].records_event = false;
  CHECK(error_of(p).find("without an event") != std::string::npos);

  p = simple_plan(2);
  p.ops[find(p, OpKind::device_update, 0)].dep_count = 0;  // no dependency at all
  CHECK(error_of(p).find("does not wait for an upload into its slot") != std::string::npos);

  p = simple_plan(2);
  p.ops[find(p, OpKind::cpu_update, 1)].dep_count = 0;  // CPU runs before its gradients land
  CHECK(error_of(p).find("does not wait for its gradient fetch") != std::string::npos);
}

TEST_CASE("the validator rejects a slot refilled before its previous occupant is done") {
  Plan p = simple_plan(1, 4);
  Op& third = p.ops[find(p, OpKind::upload, 2)];
  third.dep_count = 0;
  CHECK(error_of(p).find("refills slot 0 before") != std::string::npos);

  p = simple_plan(1, 4);
  // Point the third upload at the wrong download (subgroup 1 uses slot 1).
  p.ops[find(p, OpKind::upload, 2)].deps[0].op = find(p, OpKind::download, 1);
  CHECK(error_of(p).find("refills slot 0") != std::string::npos);
}

TEST_CASE("the validator rejects plans over budget, with bad slots, or depending forwards") {
  Plan p = simple_plan(1, 4);
  p.budget = p.staging_bytes() - 1;
  CHECK(error_of(p).find("over the budget") != std::string::npos);

  p = simple_plan(1, 4);
  p.ops[find(p, OpKind::upload, 0)].slot = 7;
  CHECK(error_of(p).find("outside the 2 staging slots") != std::string::npos);

  p = simple_plan(2);
  p.ops[0].depend(static_cast<std::uint32_t>(p.ops.size() - 1), true);
  CHECK(error_of(p).find("not issued before it") != std::string::npos);

  p = simple_plan(2);
  p.ops[find(p, OpKind::upload, 0)].lane = Lane::d2h;
  CHECK(error_of(p).find("sits on lane") != std::string::npos);

  CHECK_THROWS_AS(validate_plan(p), plan_error);
  CHECK_NOTHROW(validate_plan(simple_plan(3)));
}

TEST_CASE("a budget below one slot falls back to the CPU and says why") {
  std::vector<SubgroupShape> shapes(4, SubgroupShape{.elements = 10, .slot_bytes = 1000});
  std::vector<Place> a(4, Place::device);
  a[3] = Place::resident;
  Plan p;
  make_plan(p, shapes, a, {.budget = 999, .max_slots = 2});
  CHECK(p.fallback.find("staging budget") != std::string_view::npos);
  CHECK(p.device_subgroups() == 1);  // the resident one needs no staging
  CHECK(p.slots == 0);
  CHECK_FALSE(find_plan_error(p).has_value());
}

TEST_CASE("the validator rejects a plan missing a copy its subgroups need") {
  Plan p = simple_plan(2);
  REQUIRE(p.ops.back().kind == OpKind::push_params);
  p.ops.pop_back();  // subgroup 5 updated on the CPU, its device parameters never pushed
  CHECK(error_of(p).find("subgroup 5 runs on the CPU but its device parameters are never pushed") != std::string::npos);

  std::vector<SubgroupShape> shapes(2, SubgroupShape{.elements = 10, .slot_bytes = 160, .resident_upload_bytes = 40,
                                                     .resident_download_bytes = 20});
  std::vector<Place> a{Place::resident, Place::cpu};
  make_plan(p, shapes, a, {.budget = 0, .max_slots = 2});
  REQUIRE_FALSE(find_plan_error(p).has_value());
  const std::uint32_t down = find(p, OpKind::download, 0);
  p.ops.erase(p.ops.begin() + down);
  for (Op& op : p.ops)
    for (std::uint8_t d = 0; d < op.dep_count; ++d)
      if (op.deps[d].op > down) --op.deps[d].op;
  CHECK(error_of(p).find("resident subgroup 0 never writes back its host parameters") != std::string::npos);
}
