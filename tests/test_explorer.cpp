// StrideExplorer, through AutomaticStride and ResidentThenStride, on a scripted
// machine (support/scripted_policy.hpp), so every scenario is deterministic. Properties:
// the choice converges to the truly fastest candidate within a bounded number of
// steps, exploration never runs a candidate estimated more than twice as slow as the
// best measured one, and once settled the policy costs at most 2% over the best.

#include "support/scripted_policy.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

using namespace dos;
using namespace dos::test::scripted;

namespace {

// The policy's settled cost: the mean over the last half, against the best candidate.
void check_guarantee(const Run& r, const std::vector<double>& truth, int steps) {
  const double best = *std::min_element(truth.begin(), truth.end());
  const double late = r.mean(steps / 2, steps);
  CHECK(late <= 1.02 * best);
  CHECK(late <= 1.02 * truth[0]);  // never slower than all-CPU
  CHECK(r.reckless == 0);
}

// @p truth, but candidate @p k's steps before step @p until run @p factor times slow
// (the sweep's steps of it all fell on slow ones); counts them in @p slow_steps.
Scenario slow_in_sweep(std::vector<double> predicted, std::vector<double> truth, std::uint32_t k, int until, double factor,
                       int& slow_steps) {
  return {std::move(predicted), [truth = std::move(truth), k, until, factor, &slow_steps](std::uint32_t c, int step) {
            const bool slow = c == k && step < until;
            slow_steps += slow;
            return truth[c] * (slow ? factor : 1.0);
          }};
}

}  // namespace

TEST_CASE("the model right: the first step runs its best, and the policy stays there") {
  const std::vector<double> t{1.0, 1.6, 0.9, 0.8, 0.7, 0.75, 0.8, 0.85, 0.9};
  const Run r = drive(AutomaticStride{}, fixed(t, t), 300);
  CHECK(r.k[0] == 4);
  CHECK_FALSE(r.explored[0]);
  CHECK(settled(r, 4) == 0);
  check_guarantee(r, t, 300);
}

// The model optimistic for k = 3 (predicted fastest, truly slow) and pessimistic for
// k = 6 (predicted slow, truly fastest).
const std::vector<double> misled_predicted{1.0, 1.9, 1.2, 0.5, 1.0, 1.0, 1.8, 1.1, 1.2};
const std::vector<double> misled_truth{1.0, 1.9, 1.1, 1.3, 0.95, 0.9, 0.8, 0.85, 0.95};

TEST_CASE("the model optimistic for one stride and pessimistic for another: measurements win (both automatic policies)") {
  for (const AnyPolicy& policy : {AnyPolicy(AutomaticStride{}), AnyPolicy(ResidentThenStride{})}) {
    CAPTURE(policy.name());
    const Run r = drive(policy, fixed(misled_predicted, misled_truth), 300);
    CHECK(r.k[0] == 3);  // the model's best first
    CHECK(settled(r, 6) <= 40);
    check_guarantee(r, misled_truth, 300);
  }
}

TEST_CASE("a machine where all-CPU wins: the policy falls back to it, though the model promised every stride faster") {
  const std::vector<double> predicted{1.0, 0.9, 0.7, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9};
  const std::vector<double> truth{1.0, 1.6, 1.3, 1.2, 1.1, 1.08, 1.05, 1.04, 1.03};
  const Run r = drive(AutomaticStride{}, fixed(predicted, truth), 300);
  CHECK(settled(r, 0) <= 40);
  check_guarantee(r, truth, 300);
}

TEST_CASE("exploration never runs a candidate estimated more than twice as slow as the best measured") {
  // k = 1 and 2 are predicted (and are) far slower: they are never run.
  const std::vector<double> predicted{1.0, 5.0, 2.5, 0.9, 0.8, 0.85, 0.9, 0.95, 1.0};
  const Run r = drive(AutomaticStride{}, fixed(predicted, predicted), 1000);
  CHECK(std::count(r.k.begin(), r.k.end(), 1u) == 0);
  CHECK(std::count(r.k.begin(), r.k.end(), 2u) == 0);
  CHECK(r.reckless == 0);
}

TEST_CASE("rates that change half-way: the policy follows the new best") {
  constexpr int steps = 800;
  SUBCASE("the best slows down: all-CPU, measured before, takes over at once") {
    const std::vector<double> before{1.0, 1.5, 1.2, 0.9, 0.7, 0.8, 0.85, 0.9, 0.95};
    const std::vector<double> after{1.0, 2.5, 2.0, 1.6, 1.5, 1.4, 1.3, 1.2, 1.1};
    const Scenario sc{before, [&](std::uint32_t k, int step) { return (step < steps / 2 ? before : after)[k]; }};
    const Run r = drive(AutomaticStride{}, sc, steps);
    CHECK(settled(slice(r, 0, steps / 2), 4) <= 40);      // before
    // After, counted from the change: the candidates measured fast before the change
    // are each run until their medians catch up.
    CHECK(settled(slice(r, steps / 2, steps), 0) <= 40);
    CHECK(r.mean(3 * steps / 4, steps) <= 1.02 * after[0]);
  }
  SUBCASE("a stride once far slower becomes the best: a stale re-check finds it") {
    const std::vector<double> before{1.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.4, 1.3, 1.2};
    const std::vector<double> after{1.0, 1.9, 0.6, 1.7, 1.6, 1.5, 1.4, 1.3, 1.2};
    const Scenario sc{before, [&](std::uint32_t k, int step) { return (step < steps / 4 ? before : after)[k]; }};
    AutomaticStride p;
    p.explore.stale_after = 25;
    const Run r = drive(p, sc, steps);
    const Run late = slice(r, steps / 4, steps);
    // k = 2 measured 1.8x the best: due (0.8 / close) * stale_after steps after its
    // last run; the most overdue goes first, so at most the other 7 candidates' re-checks,
    // one per explore_every steps, can come between.
    CHECK(settled(late, 2) <= 0.8 / 0.25 * 25 + 8 * 16);
    CHECK(r.mean(steps - steps / 4, steps) <= 1.02 * 0.6);
  }
}

TEST_CASE("noisy measurements: the medians still find a best that wins by 10%, and the settled cost stays within 2%") {
  test::Rng rng(5);
  const std::vector<double> predicted{1.0, 1.2, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8};
  const std::vector<double> truth{1.0, 1.3, 1.05, 0.98, 0.9, 0.81, 0.9, 0.92, 0.95};
  std::vector<double> noise(600);
  for (double& n : noise) n = 1 + (rng.uniform(-0.03f, 0.03f));
  const Scenario sc{predicted, [&](std::uint32_t k, int step) { return truth[k] * noise[static_cast<std::size_t>(step)]; }};
  const Run r = drive(AutomaticStride{}, sc, 600);
  CHECK(settled(r, 5) <= 60);
  CHECK(r.mean(300, 600) <= 1.02 * 1.03 * 0.81);
  CHECK(r.reckless == 0);
}

TEST_CASE("the records: one per candidate, the settling step, and bad settings named") {
  const Run r = drive(AutomaticStride{}, fixed(misled_predicted, misled_truth), 100);
  const StrideExplorer& e = r.policy.target<AutomaticStride>()->explorer;
  CHECK(e.steps() == 100);
  REQUIRE(e.records().size() == 9);
  CHECK(e.records()[6].estimate() == doctest::Approx(0.8));
  // Run once, as the model's best; then never again: 60% slower is no phase of the machine.
  CHECK(e.records()[3].samples == 1);
  CHECK(e.settled_after() > 0);  // it explored the candidates the model doubted least
  CHECK(e.settled_after() <= 40);
  AutomaticStride bad;
  bad.explore.explore_every = 0;
  CHECK_THROWS_WITH_AS(bad.validate(), "dos: policy explore_every must be >= 1, got 0", std::invalid_argument);
  bad = {};
  bad.explore.max_slowdown = 0.5;
  CHECK_THROWS_WITH_AS(bad.validate(), "dos: policy max_slowdown must be >= 1, got 0.5", std::invalid_argument);
  bad = {};
  bad.explore.close = -1;
  CHECK_THROWS_WITH_AS(bad.validate(), "dos: policy close must be >= 0, got -1", std::invalid_argument);
  bad = {};
  bad.explore.stale_after = 0;
  CHECK_THROWS_WITH_AS(bad.validate(), "dos: policy stale_after must be >= 1, got 0", std::invalid_argument);
}

TEST_CASE("inherit: another residency's strides, scaled, as though swept now") {
  const Run r = drive(AutomaticStride{}, fixed(misled_predicted, misled_truth), 100);
  const StrideExplorer& from = r.policy.target<AutomaticStride>()->explorer;
  REQUIRE(from.swept());
  StrideExplorer e;
  CHECK_FALSE(e.swept());
  e.inherit(StrideExplorer{}, 0.5);  // nothing measured there: nothing taken
  CHECK_FALSE(e.running());
  e.inherit(from, 0.0);  // no scale that makes sense: nothing taken
  e.inherit(from, std::numeric_limits<double>::quiet_NaN());
  CHECK_FALSE(e.running());
  e.inherit(from, 0.5);
  // Not swept before it chooses over them: its residency may have strides to add.
  CHECK_FALSE(e.swept());
  CHECK(e.running() == from.running());
  REQUIRE(e.records().size() == from.records().size());
  for (std::size_t k = 0; k < from.records().size(); ++k) {
    CAPTURE(k);
    CHECK(e.records()[k].kept == std::min<std::uint32_t>(from.records()[k].kept, StrideExplorer::window));
    if (from.records()[k].kept > 0) CHECK(e.records()[k].median() == doctest::Approx(0.5 * from.records()[k].median()));
  }
  // The stride the residency ran in the duel it won keeps that duel's steps (the last
  // `window` of them) and runs, whatever the other residency ran; where the other
  // measured that stride `min_samples` times, the scale lines the two up on it (own
  // median over theirs), else it is the one given.
  const std::vector<double> own{9, 8, 7, 1, 2, 3, 4, 5};
  std::size_t lined_up = 0, given = 0;
  for (std::uint32_t ran = 0; ran < from.records().size(); ++ran) {
    CAPTURE(ran);
    StrideExplorer mine;
    mine.inherit(from, 0.5, ran, own);
    CHECK(mine.running() == ran);
    CHECK(mine.records()[ran].kept == StrideExplorer::window);
    CHECK(mine.records()[ran].median() == doctest::Approx(3));
    const bool measured = from.records()[ran].kept >= StrideExplorer::min_samples;
    (measured ? lined_up : given) += 1;
    const double scale = measured ? 3 / from.records()[ran].median() : 0.5;
    for (std::size_t k = 0; k < from.records().size(); ++k)
      if (k != ran && from.records()[k].kept > 0) CHECK(mine.records()[k].median() == doctest::Approx(scale * from.records()[k].median()));
  }
  CHECK(lined_up > 0);  // both ways are exercised
  CHECK(given > 0);
  StrideExplorer unlimited;  // an infinite scale is no scale
  unlimited.inherit(from, std::numeric_limits<double>::infinity());
  CHECK_FALSE(unlimited.running());
  StrideExplorer past;  // a stride past the candidates: none kept, the other's running one runs
  past.inherit(from, 0.5, 99, own);
  CHECK(past.running() == from.running());
}

TEST_CASE("inherit: a wrong scale shows in the first inherited stride's duel, and the others' inherited steps challenge no more") {
  // The other residency's all-CPU steps ran 2x what they take here, so the scale
  // (all-CPU's own steps here over its steps there) halves every inherited stride:
  // each looks 20-45% faster than all-CPU, and each is truly 10-60% slower. On
  // zen5_none_first (explorer_seeds) such strides challenged one after another, four
  // pairs each, into the late half. The first one's duel steps rose 2x over the
  // inherited step that set it off, while all-CPU's stayed: the scale was wrong for
  // streaming, and the other strides' inherited steps set off nothing more.
  const std::vector<double> truth{1.0, 1.6, 1.5, 1.4, 1.3, 1.25, 1.2, 1.15, 1.1};
  std::vector<double> there = truth;
  there[0] = 2.0;
  const Run r = drive(AutomaticStride{}, fixed(truth, there), 100);
  const StrideExplorer& from = r.policy.target<AutomaticStride>()->explorer;
  REQUIRE(from.records()[0].kept >= StrideExplorer::min_samples);
  AutomaticStride here;
  const std::vector<double> own(StrideExplorer::window, 1.0);
  here.explorer.inherit(from, 1.0, 0, own);
  REQUIRE(here.explorer.records()[8].median() < 0.99 * 1.0);  // it looks faster than all-CPU
  const Run after = drive(here, fixed(truth, truth), 150);
  const auto streamed = std::count_if(after.k.begin(), after.k.end(), [](std::uint32_t k) { return k != 0; });
  CHECK(streamed >= 1);  // one duel, the fastest-looking stride's
  CHECK(streamed <= static_cast<long>(detail::DuelScore::confirm));
  // The others are discredited: no longer the best measured, nor counted in the reach.
  const auto& records = after.policy.target<AutomaticStride>()->explorer.records();
  const auto discredited = std::count_if(records.begin(), records.end(), [](const StrideExplorer::Record& c) { return c.discredited; });
  CHECK(discredited == static_cast<long>(records.size()) - 2);  // all but all-CPU and the stride that dueled
  CHECK(after.mean(75, 150) <= 1.02 * truth[0]);
  CHECK(after.reckless == 0);
}

TEST_CASE("property: whatever the model's errors, the settled policy costs at most 2% over the best and over all-CPU") {
  test::Rng rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> truth(9), predicted(9);
    for (std::size_t k = 0; k < 9; ++k) {
      truth[k] = 0.5 + static_cast<double>(rng.uniform(0.0f, 1.5f));
      predicted[k] = truth[k] * static_cast<double>(rng.uniform(0.5f, 2.0f));  // off by up to 2x either way
    }
    CAPTURE(trial);
    const Run r = drive(AutomaticStride{}, fixed(predicted, truth), 400);
    CHECK(r.reckless == 0);
    const double best = *std::min_element(truth.begin(), truth.end());
    // The best may sit beyond 2x the model's promise for it; the guarantee is against
    // all-CPU and against what exploration may reach.
    const double late = r.mean(200, 400);
    CHECK(late <= 1.02 * truth[0]);
    if (predicted[static_cast<std::size_t>(std::min_element(truth.begin(), truth.end()) - truth.begin())] <= 2 * best)
      CHECK(late <= 1.02 * best);
  }
}

TEST_CASE("a machine whose speed jumps between two levels: the settled policy keeps up with all-CPU") {
  // All-CPU truly the best, k = 8 and 7 close; every candidate 1.4x slower in phases
  // of ~25 steps. A slow phase makes every older measurement look fast.
  constexpr int steps = 600;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const Noisy n = two_level(seed, steps);
    const Run r = drive(AutomaticStride{}, n.scenario, steps);
    CAPTURE(seed);
    CHECK(r.mean(steps / 2, steps) <= 1.02 * n.late_against);
    CHECK(r.reckless == 0);
  }
}

TEST_CASE("slow steps in a quarter of the steps: the policy keeps the stride that wins by 9%") {
  // Two slow steps among k = 8's last five raise its median past all-CPU's, measured
  // in quiet steps long before; only a duel (the two side by side) may take k = 8's
  // place, and all-CPU loses it. Medians alone lost k = 8 in 13 of these 20 machines
  // (docs/design.md, "Choosing the split").
  // Settling is itself a matter of chance here: three slow steps in a row of k = 8
  // lose it a duel it then wins back (a return match). Over 200 seeds
  // (tests/explorer_seeds) the median machine settled by step 14 and 95% by step 41.
  constexpr int steps = 400;
  int late = 0;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const Noisy n = slow_steps(seed, steps);
    const Run r = drive(AutomaticStride{}, n.scenario, steps);
    CAPTURE(seed);
    CHECK(r.mean(steps / 2, steps) <= 1.02 * n.late_against);
    CHECK(settled(r, 8) <= steps / 2);
    late += settled(r, 8) > 40;
    CHECK(r.reckless == 0);
  }
  CHECK(late <= 2);
}

TEST_CASE("duels: five slow steps in a row of the running candidate do not give its place away") {
  // k = 8 truly 10% faster than all-CPU. Steps 100-104 run 1.3x slow, whatever they
  // run: k = 8's median passes all-CPU's, measured in quiet steps. A median-only
  // choice would switch; a duel, side by side in quiet steps, keeps k = 8.
  const std::vector<double> truth{1.0, 3.0, 2.5, 2.2, 2.0, 1.8, 1.6, 1.2, 0.9};
  const std::vector<double> predicted{1.0, 3.0, 2.5, 2.2, 2.0, 1.8, 1.6, 1.2, 0.9};
  const Scenario sc{predicted, [&](std::uint32_t k, int step) { return truth[k] * (step >= 100 && step < 105 ? 1.3 : 1.0); }};
  const Run r = drive(AutomaticStride{}, sc, 400);
  CHECK(settled(r, 8) <= 40);
  CHECK(r.reckless == 0);
  // What that cost: every step that ran another candidate after the slow ones was an
  // explored one (one duel, and re-checks), and there were few.
  int others = 0;
  for (int i = 100; i < 400; ++i) {
    const auto j = static_cast<std::size_t>(i);
    if (r.k[j] == 8) continue;
    ++others;
    CHECK(r.explored[j]);
  }
  CHECK(others <= 12);
}

TEST_CASE("duels: a candidate whose sweep steps were all slow gets its playoff, and takes the place") {
  // k = 8 truly 9% faster than all-CPU, but each of its sweep steps ran 1.25x slow.
  // Its fastest step came within `close` of the incumbent's: it meets it right after
  // the sweep, in quiet steps, and wins.
  const std::vector<double> truth{1.0, 3.0, 2.5, 2.2, 2.0, 1.8, 1.6, 1.2, 0.91};
  const std::vector<double> predicted{1.0, 3.0, 2.5, 2.2, 2.0, 1.8, 1.6, 1.2, 1.3};
  int sweep_steps_of_8 = 0;
  const Run r = drive(AutomaticStride{}, slow_in_sweep(predicted, truth, 8, 27, 1.25, sweep_steps_of_8), 300);
  REQUIRE(sweep_steps_of_8 >= 3);  // the sweep measured it, slow, enough to trust
  CHECK(settled(r, 8) <= 60);
  CHECK(r.mean(150, 300) <= 1.02 * 0.91);
  CHECK(r.reckless == 0);
}

TEST_CASE("duels: a playoff won judges the playoffs still due again, against the winner") {
  // The scripted Xeon machine's strides (xeon_16m), without noise but for k = 8's sweep
  // steps, 1.3x slow: 7 leads after the sweep, and the playoffs drawn against it are
  // all-CPU's, 6's, 8's (its fastest 1.16, within `close` of 7's 0.967) and 5's (1.18).
  // 8 wins its playoff; 5 runs 1.32x 8's time, far from `close` of it, and its playoff
  // would only cost its steps: it is dropped. All-CPU keeps its own, whatever it ran.
  const std::vector<double> truth{1.0, 4.24, 2.25, 1.73, 1.235, 1.18, 0.97, 0.967, 0.895};
  const std::vector<double> predicted{1.0, 3.6, 1.9, 1.5, 1.1, 1.1, 0.92, 0.92, 0.88};
  constexpr int sweep = 27;
  int slow_steps_of_8 = 0;
  constexpr int steps = 120;
  const Run r = drive(AutomaticStride{}, slow_in_sweep(predicted, truth, 8, sweep, 1.3, slow_steps_of_8), steps);
  REQUIRE(slow_steps_of_8 >= 3);  // the sweep measured it, slow, enough to trust
  CHECK(settled(r, 8) <= 60);
  const auto after_sweep = r.k.begin() + sweep;
  CHECK(std::count(after_sweep, r.k.end(), 5u) == 0);
  CHECK(std::count(after_sweep, r.k.end(), 0u) >= 4);  // all-CPU's playoff, four pairs
  CHECK(r.mean(steps / 2, steps) <= 1.02 * truth[8]);
  CHECK(r.reckless == 0);
}

TEST_CASE("duels: a loser whose wait is over and whose steps beat the incumbent's challenges before the playoffs still due") {
  // What run AM met on the Xeon VM (link 1, 16M, run 3). All-CPU leads after the sweep;
  // k = 8, truly 8% faster, had slow sweep steps but the fastest of those near all-CPU,
  // so its playoff comes first; there five of its eight steps run 1.3x slow, and it
  // loses on the median though its three fast steps beat all-CPU's (the last of them
  // among the five it keeps, so its challenge is due later). The playoffs of 6, 7,
  // 5 and 4 are still due, 4 and 5 at 1.2x all-CPU's time. k = 8's challenge, due
  // `explore_every` steps after its loss, goes before them; once it has won, 4 and 5
  // are no longer near the incumbent and never run.
  const std::vector<double> truth{1.0, 4.0, 2.5, 1.8, 1.2, 1.2, 1.05, 1.05, 0.92};
  const std::vector<double> predicted{1.0, 3.6, 2.2, 1.6, 1.1, 1.1, 0.95, 0.95, 0.9};
  int runs_of_8 = 0, slow_playoff_steps = 0;
  const Scenario sc{predicted, [&](std::uint32_t k, int) {
                      if (k != 8) return truth[k];
                      const int run = runs_of_8++;
                      if (run < 3) return truth[8] * 1.12;  // the sweep: 1.03, near all-CPU
                      const bool slow = run < 11 && run != 3 && run != 5 && run != 9;  // the playoff: 3 of 8 fast
                      slow_playoff_steps += slow;
                      return truth[8] * (slow ? 1.3 : 1.0);
                    }};
  constexpr int steps = 120;
  const Run r = drive(AutomaticStride{}, sc, steps);
  REQUIRE(slow_playoff_steps == 5);  // the playoff ran as scripted, over eight pairs
  const auto after_sweep = r.k.begin() + 24;  // the sweep's steps of 4 and 5 end before
  REQUIRE(std::count(r.k.begin(), after_sweep, 4u) > 0);
  CHECK(std::count(after_sweep, r.k.end(), 4u) == 0);
  CHECK(std::count(after_sweep, r.k.end(), 5u) == 0);
  CHECK(settled(r, 8) <= 80);
  CHECK(r.mean(steps / 2, steps) <= 1.02 * truth[8]);
  CHECK(r.reckless == 0);
}

TEST_CASE("duels: all-CPU gets its playoff even when its sweep steps were far slower than the winner's") {
  // What bench_automatic met on the Zen 5 VM: the first steps of a run are the
  // slowest, and all-CPU's sweep step fell there (2.4x its later time) while the
  // strides were measured later. k = 8 then looked fastest though it ran 1.35x slower
  // than all-CPU; all-CPU, too far behind for a playoff, was never run again, and the
  // run settled on k = 8.
  const std::vector<double> truth{1.0, 3.8, 2.6, 2.1, 1.8, 1.75, 1.55, 1.5, 1.35};
  const std::vector<double> predicted{1.0, 1.5, 0.9, 0.85, 0.8, 0.85, 0.9, 0.95, 1.0};
  for (const int warm_up : {4, 6}) {
    CAPTURE(warm_up);
    int slow_cpu_steps = 0;
    const Scenario sc{predicted, [&](std::uint32_t k, int step) {
                        slow_cpu_steps += step < warm_up && k == 0;
                        return truth[k] * (step < warm_up ? 2.4 : 1.0);
                      }};
    const Run r = drive(AutomaticStride{}, sc, 300);
    REQUIRE(slow_cpu_steps >= 1);
    CHECK(settled(r, 0) <= 60);  // after the closer candidates' playoffs
    check_guarantee(r, truth, 300);
  }
}

TEST_CASE("duels: all-CPU's playoff comes second at the latest, before the farther strides") {
  // The scripted EPYC machine at link 2 (epyc_link2) without noise, but for all-CPU's
  // sweep steps, 1.3x slow: k = 8 leads after the sweep, and 7, 6, 5 and 4 come within
  // `close` of it. Fastest first, all-CPU's playoff would wait for four of theirs (32
  // steps, at 1.04-1.22x its time); it comes right after the nearest stride's, and wins.
  const std::vector<double> truth{1.0, 3.87, 2.23, 1.77, 1.39, 1.3, 1.2, 1.18, 1.14};
  const std::vector<double> predicted{1.0, 2.8, 1.5, 1.2, 1.0, 0.95, 0.9, 0.9, 0.92};
  constexpr int sweep = 27;
  int slow_cpu_steps = 0;
  constexpr int steps = 120;
  const Run r = drive(AutomaticStride{}, slow_in_sweep(predicted, truth, 0, sweep, 1.3, slow_cpu_steps), steps);
  REQUIRE(slow_cpu_steps >= 1);
  const auto after_sweep = r.k.begin() + sweep;
  const auto first_cpu = std::find(after_sweep, r.k.end(), 0u);
  REQUIRE(first_cpu != r.k.end());
  // Before all-CPU's playoff: the incumbent's steps and one stride's playoff.
  std::vector<std::uint32_t> before(after_sweep, first_cpu);
  std::sort(before.begin(), before.end());
  before.erase(std::unique(before.begin(), before.end()), before.end());
  CHECK(before.size() <= 2);
  CHECK(settled(r, 0) <= sweep + 2 * 2 * StrideExplorer::confirm_pairs);
  CHECK(r.mean(steps / 2, steps) <= 1.02 * truth[0]);
  CHECK(r.reckless == 0);
}

TEST_CASE("duels: all-CPU's one sweep step 2.4-2.5x slow, and the model refined by it: all-CPU is still within reach") {
  // What bench_automatic met on the EPYC VM at link 2 (2026-12-07): all-CPU's one sweep
  // step, the run's first, ran 2.4-2.5x its time. In run AW (16M) the model, refined
  // by that step, predicted it 1.7x: judged by the step's median, all-CPU was more than
  // twice k = 8's time and never ran again. In run AX (64M) the refined model
  // predicted it 2.3x, out of reach as well, and its playoff waited to step 96. Judged
  // by the model's prediction, now (1.7) or before that step (1.0), it is within reach,
  // gets its playoff, and wins.
  const std::vector<double> truth{1.0, 3.87, 2.23, 1.77, 1.39, 1.3, 1.2, 1.18, 1.14};
  struct Case {
    double before, first_step, refined;  // all-CPU: the model before its first step, that step, the model after
  };
  for (const Case c : {Case{1.7, 2.4, 1.7}, Case{1.0, 2.5, 2.3}}) {
    CAPTURE(c.refined);
    const std::vector<double> predicted{c.before, 2.8, 1.5, 1.2, 1.0, 0.95, 0.9, 0.9, 0.92};
    int runs_of_cpu = 0;
    Scenario sc{predicted, [&](std::uint32_t k, int) { return truth[k] * (k == 0 && runs_of_cpu++ == 0 ? c.first_step : 1.0); }};
    sc.refined = [&](std::uint32_t k, int) { return k == 0 && runs_of_cpu > 0 ? c.refined : predicted[k]; };
    constexpr int steps = 120;
    const Run r = drive(AutomaticStride{}, sc, steps);
    REQUIRE(runs_of_cpu >= 1);
    CHECK(settled(r, 0) <= 60);
    CHECK(r.mean(steps / 2, steps) <= 1.02 * truth[0]);
    CHECK(r.reckless == 0);
  }
}

TEST_CASE("duels: steps 1.2-2.5x slow one in eight; all-CPU's one slow sweep step does not rule it out for good") {
  // All-CPU truly the best, k = 8 10% behind with the model promising it faster. Where
  // all-CPU's one sweep step fell on a slow step (2.3x), it measured out of reach of
  // k = 8 and never ran again: 26 of 1000 such machines kept k = 8 to the end, 1.13x
  // all-CPU at worst (tests/explorer_seeds). One step is no verdict: it gets its playoff.
  constexpr int steps = 600;
  int worst_astray = 0;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    const Noisy n = heavy_tail(seed, steps);
    const Run r = drive(AutomaticStride{}, n.scenario, steps);
    CAPTURE(seed);
    CHECK(r.mean(steps / 2, steps) <= 1.02 * n.late_against);
    CHECK(r.reckless == 0);
    worst_astray = std::max(worst_astray, astray(r, 0, steps / 2));
  }
  // A lucky duel of k = 8 may keep it until its return match, not for good.
  CHECK(worst_astray <= 24);
}

TEST_CASE("duels: streaming steps far noisier than all-CPU's (the Zen 5 VM's); k = 8, 11% faster, is found and kept") {
  // One streaming step in six 1.15-1.6x slow, one all-CPU step in a hundred
  // (support/scripted_policy.hpp, `streaming_noise`). Over 2000 seeds (explorer_seeds)
  // none ended over 2% at 600 steps.
  constexpr int steps = 600;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const Noisy n = streaming_noise(seed, steps);
    const Run r = drive(AutomaticStride{}, n.scenario, steps);
    CAPTURE(seed);
    CHECK(r.mean(steps / 2, steps) <= 1.02 * n.late_against);
    CHECK(r.mean(steps / 2, steps) <= 1.02 * late_mean([&](int i) { return n.scenario.truth(0, i); }, steps));
    CHECK(r.reckless == 0);
  }
}

TEST_CASE("duels: a running candidate that falls far behind is challenged at once, however long all-CPU must wait") {
  // k = 8 truly 10% faster than all-CPU. Runs of six slow steps from 100, 150 and 230
  // each set off a challenge by all-CPU, which it loses: its wait doubles to over a
  // hundred steps. At step 260 k = 8 becomes 3x slower for good (another job took
  // the link): more than `max_slowdown` behind all-CPU, it must not run on until the
  // wait is over.
  const std::vector<double> truth{1.0, 3.0, 2.5, 2.2, 2.0, 1.8, 1.6, 1.2, 0.9};
  constexpr int steps = 400, change = 260;
  const auto slow_run = [](int step) { return (step >= 100 && step < 106) || (step >= 150 && step < 156) || (step >= 230 && step < 236); };
  const Scenario sc{truth, [&](std::uint32_t k, int step) {
                      if (k == 8 && step >= change) return 3 * truth[8];
                      return truth[k] * (slow_run(step) ? 1.3 : 1.0);
                    }};
  const Run r = drive(AutomaticStride{}, sc, steps);
  CHECK(settled(slice(r, 0, change), 8) <= 40);
  // The waits did build up: the same machine, stopped at the change.
  const Run before = drive(AutomaticStride{}, sc, change);
  const StrideExplorer& e = before.policy.target<AutomaticStride>()->explorer;
  CHECK(e.records()[0].duel_at >= change + 50);
  CHECK(settled(slice(r, change, steps), 0) <= 12);
  CHECK(r.reckless == 0);
}

TEST_CASE("duels: a phase where every other step runs 3x slow sets off no challenge") {
  // k = 8 truly 10% faster than all-CPU. From step 150 to 190 every other step runs 3x
  // slow, whatever it runs (the Zen 5 VM had such phases, 1.5-3x, for twenty steps):
  // k = 8's median then reads 2.7, more than twice all-CPU's (1.0, measured before),
  // but its fastest steps still read 0.9. Nothing changed that a duel could follow,
  // and nothing is due for a re-check before step 200.
  const std::vector<double> truth{1.0, 3.0, 2.5, 2.2, 2.0, 1.8, 1.6, 1.2, 0.9};
  const Scenario sc{truth, [&](std::uint32_t k, int step) {
                      return truth[k] * (step >= 150 && step < 190 && step % 2 == 1 ? 3.0 : 1.0);
                    }};
  const Run r = drive(AutomaticStride{}, sc, 200);
  CHECK(settled(slice(r, 0, 150), 8) <= 40);
  const Run phase = slice(r, 150, 200);
  CHECK(std::count(phase.explored.begin(), phase.explored.end(), true) == 0);
  CHECK(std::count(phase.k.begin(), phase.k.end(), 8u) == 50);
}

namespace {
// Plays one duel of detail::DuelScore to its end; @p pair gives the i-th pair's times,
// the incumbent's then the challenger's. Returns {over, won, pairs played}.
struct Verdict {
  bool over = false;
  bool won = false;
  std::size_t pairs = 0;
};
template <class Pair>
Verdict play(Pair pair, bool confirm = false) {
  detail::DuelScore score;
  score.restart(confirm);
  Verdict v;
  for (std::size_t i = 0; i < detail::DuelScore::confirm && !v.over; ++i) {
    const auto [incumbent, challenger] = pair(i);
    v.over = score.add(incumbent, challenger, v.won);
    v.pairs = score.pairs;
  }
  return v;
}
}  // namespace

TEST_CASE("duels: a split verdict plays on to eight pairs; a clear one ends at four") {
  // The challenger 10% faster, but two of its first four steps slow (1.3x): its two
  // fastest won, the median of the ratios did not. Over four pairs that was a loss.
  const auto split_then = [](double later) {
    return [later](std::size_t i) -> std::pair<double, double> {
      if (i < 4) return {1.0, i % 2 == 1 ? 1.3 * 0.9 : 0.9};
      return {1.0, later};
    };
  };
  SUBCASE("fast steps after the split: it wins over eight") {
    const Verdict v = play(split_then(0.9));
    CHECK(v.over);
    CHECK(v.won);
    CHECK(v.pairs == detail::DuelScore::confirm);
  }
  SUBCASE("slow steps after the split: it loses over eight") {
    const Verdict v = play(split_then(1.3 * 0.9));
    CHECK(v.over);
    CHECK_FALSE(v.won);
    CHECK(v.pairs == detail::DuelScore::confirm);
  }
  SUBCASE("a challenger no faster does not split: it loses at four") {
    const Verdict v = play([](std::size_t i) -> std::pair<double, double> { return {1.0, i % 2 == 1 ? 1.3 : 1.0}; });
    CHECK(v.over);
    CHECK_FALSE(v.won);
    CHECK(v.pairs == detail::DuelScore::length);
  }
  SUBCASE("a clear win at four pairs ends there, unless it must be confirmed") {
    const auto faster = [](std::size_t i) -> std::pair<double, double> { return {1.0, i == 0 ? 0.85 : 0.9}; };
    // (A third pair whose incumbent step was fast makes no clear win: every challenger
    // step must beat every incumbent step by the margin.)
    const auto no_clear_win = [&](std::size_t i) -> std::pair<double, double> { return i == 2 ? std::pair{0.95, 0.97} : faster(i); };
    const Verdict v = play(no_clear_win);
    CHECK(v.over);
    CHECK(v.won);
    CHECK(v.pairs == detail::DuelScore::length);
    CHECK(play(no_clear_win, /*confirm=*/true).pairs == detail::DuelScore::confirm);
    CHECK(play(faster, /*confirm=*/true).pairs == detail::DuelScore::clear);  // a clear win needs no confirming
  }
}

TEST_CASE("duels: a loser's wait doubles from explore_every up to stale_after, and never falls below explore_every") {
  // Both explorers wait this way after a lost challenge (the residency's after a lost
  // rise re-check), so the walk is checked once here.
  std::int64_t wait = 0;
  std::vector<std::int64_t> walk;
  for (int i = 0; i < 7; ++i) walk.push_back(wait = detail::doubled_wait(wait, 20, 200));
  CHECK(walk == std::vector<std::int64_t>{20, 40, 80, 160, 200, 200, 200});
  CHECK(detail::doubled_wait(0, 20, 5) == 20);    // a stale_after below explore_every
  CHECK(detail::doubled_wait(40, 20, 5) == 20);
  CHECK(detail::doubled_wait(0, 1, 1) == 1);
}

TEST_CASE("property: with one streaming step in five 1.2-1.4x slow, a 10% faster challenger wins 9 duels in 10 and an equal one hardly ever") {
  // The Zen 5 VM's streaming steps (docs/design.md, "Choosing the split"). Four-pair
  // verdicts alone lost 17% of these duels for the faster challenger.
  const auto rate = [](double challenger, bool confirm) {
    int won = 0;
    constexpr int duels = 4000;
    for (std::uint64_t seed = 1; seed <= duels; ++seed) {
      test::Rng rng(seed);
      const auto noisy = [&](double t) { return t * (1 + 0.01 * static_cast<double>(rng.uniform(-1.0f, 1.0f))); };
      won += play([&](std::size_t) -> std::pair<double, double> {
               const double i = noisy(1.0);
               double c = noisy(challenger);
               if (rng.below(5) == 0) c *= 1.2 + 0.2 * static_cast<double>(rng.uniform(0.0f, 1.0f));
               return {i, c};
             }, confirm).won;
    }
    return static_cast<double>(won) / duels;
  };
  for (const bool confirm : {false, true}) {
    CAPTURE(confirm);
    CHECK(rate(0.9, confirm) >= 0.9);
    CHECK(rate(1.0, confirm) <= 0.05);
    CHECK(rate(1.05, confirm) == 0);
  }
}
