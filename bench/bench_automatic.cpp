// Does the automatic policy ever lose? On the emulated device, at several link speeds
// and model sizes, every contender (all-CPU, each fixed stride, the automatic stride;
// static_fraction and resident_then_stride) steps its own copy of the same model, in
// alternating rounds within one process so that they all see the same machine. Per
// run, over the last half of the steps (the automatic policies settle in the first
// half), the figures are medians of paired ratios: one contender's update time over
// another's in the same round, the median over the rounds. The VM's bandwidth moves
// from minute to minute; pairing cancels that, and a median is not moved by one slow
// step as a mean is.
//
//   auto/best   the automatic stride over the best of all-CPU and the fixed strides
//               (the one with the shortest median late step; not the least of nine
//               noisy means, which would beat any one contender's typical time)
//   auto/cpu    the automatic stride over all-CPU
//   rts/best    resident_then_stride (which may keep subgroups resident, and moves them
//               between steps as it compares counts) over the best of all-CPU, the
//               fixed strides and static_fraction
//   rts/cpu     resident_then_stride over all-CPU
//   rts/sf      resident_then_stride over static_fraction
//   cpu/cpu     a second all-CPU copy over the first: the same plan on both sides, so
//               its spread is how finely this machine can tell two contenders apart
//   sf/sf       the same for a second static_fraction copy: with residents, copies of
//               one plan differed by up to 5% from run to run on the Zen 5 VM (each
//               copy's device threads and memory are its own), which bounds how finely
//               rts/sf can be read
//   k/k         the same for a second copy of the best fixed stride (each fixed stride
//               has one): how finely auto/best can be read when the best streams.
//               The copy runs in the block (below); where the best ran in the
//               compared group, k/k also holds any difference between the two groups
//   met         the runs that met both bounds of their policy (below)
//   early       the runs in which the fixed contender fastest over the first half
//               (all-CPU or a stride; for "rts early", static_fraction too) met those
//               bounds over the last half: what a policy that knew the first half
//               exactly, and kept its best, would have met. Where it did not, the
//               machine changed during the run, and a policy choosing from what it
//               measured meets the bounds only by running other plans again in time
//   same plan   each policy's late steps that ran a fixed contender's plan, over that
//               contender's in the same round: the automatic stride's all-CPU or k
//               steps; resident_then_stride's where it kept static_fraction's count
//               and streamed nothing, or kept none, with no move right before or after.
//               Median [least-most] over the runs that had such steps, and how many
//               did. Near 1, a ratio above is the policy's choice; far from it, the
//               policy's copy ran the same plan slower or faster than the fixed one's
//               (in run AO at 64M, resident_then_stride's steps of static_fraction's
//               16 residents read 1.21-1.22x static_fraction's in two runs)
//
//   placed      the same ratios with each copy's placement taken out. After the
//               run every contender runs all-CPU for `kPlacementRounds` rounds in a
//               shuffled order; a copy's placement is the median of its step over
//               the round's median step, and a ratio a/b "placed" is multiplied by
//               b's placement over a's. On the EPYC VM (2026-12-07, bench_copies)
//               one all-CPU copy of six ran at 1.12x the median copy, and in probes
//               copies spread over 0.94-1.14x, each at the same ratio in the first
//               and the second half of the rounds: a property of where the copy's
//               memory lies, not of the machine's phases, and one no policy can
//               choose. The raw ratios carry it on both sides; the placed ones
//               carry instead the check's own error, about 1-2% (cpu/cpu placed, the
//               same plan on both sides, shows it: in run AV, where the copies spread
//               over only 0.97-1.05, it was no tighter than cpu/cpu; see
//               docs/policy-runs.md). The bounds are judged on the raw ratios
//
// The emulated device's streams run on a CPU of their own and the contenders' CPU side
// on the others (device_cpus.hpp; DOS_BENCH_PIN=0 leaves both to the OS): unpinned, the
// OS sometimes ran a contender's device Adam on the CPU side's core for its whole life,
// and copies of one plan read 0.87-1.13x each other (bench_moves, 2026-12-06).
//
// The table gives their median and worst over the runs, with the steps the
// automatic policy took to settle (its last exploration of a candidate it had not
// measured enough). Targets (issue 11): auto/best <= 1.05 and auto/cpu <= 1.02, and the
// same for rts/best and rts/cpu. A step's time is the whole step() call, so that the
// moves of resident_then_stride's residents between steps count.
//
//   build/release/bench/bench_automatic [--runs 5] [--steps 80] [--sizes 16,64]
//                                       [--links 0.3,0.6,1,2] [--trace]
//                                       [--stride-copies yes|no|auto]
// --stride-copies: the control copies of the fixed strides (k/k); auto, the default,
// runs them where 22 copies of the model fit in 80% of the machine's memory.
// --trace prints, for every run, the two strides that join the compared group for the
// last half (see run_once), its ratios above, the automatic policy's k step by step
// (E: an exploring step), each of its steps over the same plan's fixed contender,
// resident_then_stride's residents and k step by step (r9k3E: 9 resident, k = 3,
// explored), its update times as it measured them (without the moves), the late
// medians, and each copy's placement.

#include "device_cpus.hpp"
#include "rounds.hpp"

#include <dos/optimizer.hpp>

#include <fmt/core.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

constexpr std::size_t kSubgroup = 1u << 20;
using Optimizer = dos::InterleavedOptimizer<dos::EmulatedDeviceBackend>;

struct Settings {
  int runs = 5;
  int steps = 80;
  std::vector<double> sizes{16, 64};  // millions of parameters
  std::vector<double> links{0.3, 0.6, 1, 2};
  bool trace = false;
  int stride_copies = -1;  // --stride-copies: 1 yes, 0 no, -1 where they fit in memory
};

std::vector<double> numbers(const char* list) {
  std::vector<double> out;
  for (const char* p = list; *p != '\0';) {
    char* end = nullptr;
    out.push_back(std::strtod(p, &end));
    if (end == p) {
      fmt::print(stderr, "bench_automatic: not a list of numbers: {}\n", list);
      std::exit(2);
    }
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        fmt::print(stderr, "bench_automatic: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--runs") s.runs = std::atoi(value());
    else if (a == "--steps") s.steps = std::atoi(value());
    else if (a == "--sizes") s.sizes = numbers(value());
    else if (a == "--links") s.links = numbers(value());
    else if (a == "--trace") s.trace = true;
    else if (a == "--stride-copies") {
      const std::string_view v = value();
      if (v == "yes") s.stride_copies = 1;
      else if (v == "no") s.stride_copies = 0;
      else if (v == "auto") s.stride_copies = -1;
      else {
        fmt::print(stderr, "bench_automatic: --stride-copies takes yes, no or auto, not {}\n", v);
        std::exit(2);
      }
    }
    else {
      fmt::print(stderr, "bench_automatic: unknown argument {}\n", a);
      std::exit(2);
    }
  }
  if (s.runs < 1 || s.steps < 4) {
    fmt::print(stderr, "bench_automatic: --runs must be >= 1 and --steps >= 4\n");
    std::exit(2);
  }
  return s;
}

struct Contender {
  std::string name;
  dos::AnyPolicy policy;
  std::vector<float> values;
  std::unique_ptr<Optimizer> opt;
  std::vector<double> seconds;  // update time per step
  std::vector<double> measured;  // what the policy measured of it (the update, not the moves after it)
  std::vector<std::uint32_t> strides;  // the stride each step streamed the others at (0: none streamed)
  std::vector<std::size_t> residents;  // the subgroups each step kept resident
  double placement = 1;  // its all-CPU step over the median copy's, after the run
};

// Rounds of the placement check after each run (see the file comment).
constexpr int kPlacementRounds = 40;

// Both bounds of issue 11 on one run: over the best fixed contender, and over all-CPU.
bool meets(double over_best, double over_cpu) { return over_best <= 1.05 && over_cpu <= 1.02; }

// One run's ratios that the bounds are judged on, and the all-CPU control beside them.
struct Ratios {
  double auto_best = 0, auto_cpu = 0, rts_best = 0, rts_cpu = 0, rts_sf = 0, cpu_cpu = 0;
};

// The runs' ratios of one table cell, column by column, and the runs that met the
// bounds.
struct Columns {
  std::vector<double> best, cpu, rts_best, rts_cpu, rts_sf, control;
  int ok = 0, rts_ok = 0;
  void add(const Ratios& r) {
    best.push_back(r.auto_best);
    cpu.push_back(r.auto_cpu);
    rts_best.push_back(r.rts_best);
    rts_cpu.push_back(r.rts_cpu);
    rts_sf.push_back(r.rts_sf);
    control.push_back(r.cpu_cpu);
    ok += meets(r.auto_best, r.auto_cpu);
    rts_ok += meets(r.rts_best, r.rts_cpu);
  }
};

struct RunResult {
  Ratios raw;
  Ratios placed;  // each copy's placement taken out (see the file comment)
  double sf_sf = 0, best_best = 0;
  // The fixed contender fastest over the first half, run through the last half: what a
  // policy that knew the first half exactly, and then stayed, would have met.
  double early_best = 0, early_cpu = 0, rts_early_best = 0, rts_early_cpu = 0;
  std::int64_t settled = 0, rts_settled = 0;
  std::size_t residents = 0;  // resident_then_stride's count chosen at the end
  std::uint32_t k = 0;  // the automatic policy's last choice
  std::string best;     // the fixed contender it is measured against
  // Each policy's late steps that ran a fixed contender's plan, over that contender's
  // in the same round (median; NaN where none did), and how many such steps.
  double auto_same = 0, rts_same = 0;
  std::size_t auto_same_steps = 0, rts_same_steps = 0;
  std::string early, rts_early;  // the fixed contenders fastest over the first half
};

using bench::median;

// The median of a contender's steps in the last half (the automatic policies settle in
// the first half), or in the first.
double half_median(const Contender& c, bool late = true) {
  const auto half = c.seconds.begin() + static_cast<std::ptrdiff_t>(c.seconds.size() / 2);
  return late ? median(std::vector<double>(half, c.seconds.end())) : median(std::vector<double>(c.seconds.begin(), half));
}
double late_median(const Contender& c) { return half_median(c); }

// The median, over the last half of the steps, of a's time over b's in the same round:
// the machine's bandwidth moves from minute to minute, and one slow step would weigh
// on a mean of either.
double paired(const Contender& a, const Contender& b) {
  std::vector<double> r;
  for (std::size_t i = a.seconds.size() / 2; i < a.seconds.size(); ++i) r.push_back(a.seconds[i] / b.seconds[i]);
  return median(r);
}

RunResult run_once(const dos::EmulatedLink& m, std::size_t elements, const std::vector<float>& grad,
                   const Settings& s, bool trace, bool stride_copies) {
  // Each round runs the contenders in two groups. First a block, in an order that
  // starts one further along each round: the fixed strides and their copies. Then
  // the compared group, in an order shuffled afresh each round: both automatic
  // policies, all-CPU, static_fraction and a copy of each, and from the late half on
  // the two strides fastest over the first half (their copies stay in the block). The
  // compared pairs run a few milliseconds apart, not a round apart, and none of them
  // always follows the same contender: a step run right after a streaming one was
  // measured 1-3% slower than the same plan after an all-CPU step, which in a fixed
  // cycle biased every ratio against whichever contender followed the last stride.
  // The strides likely to be the best join the group because a probe (2026-12-07)
  // measured one 1-2% slower there than in the block, a bias against the policies
  // when auto/best divides by a stride in the block. Every contender in one shuffled
  // order instead would put compared pairs up to a round apart again (0.8 s at 16M),
  // where the all-CPU control once spread over 0.83-1.07, against 0.95-1.02 with the
  // pairs adjacent (docs/policy-runs.md, runs J and D-F).
  // (static_fraction ran in the block until 2026-12-03: resident_then_stride's steps
  // over its, with the same plan on both sides, then spread over 0.6-2.5 in one run,
  // against 0.98-1.02 for the control.)
  std::vector<Contender> cs;
  cs.push_back({"resident_then_stride", dos::ResidentThenStride{}, {}, {}, {}});
  cs.push_back({"automatic", dos::AutomaticStride{}, {}, {}, {}});
  cs.push_back({"all_cpu", dos::AllCpu{}, {}, {}, {}});
  cs.push_back({"all_cpu_again", dos::AllCpu{}, {}, {}, {}});
  cs.push_back({"static_fraction", dos::StaticFraction{0.25}, {}, {}, {}});
  cs.push_back({"static_fraction_again", dos::StaticFraction{0.25}, {}, {}, {}});
  for (std::uint32_t k = 1; k <= 8; ++k) cs.push_back({fmt::format("stride_{}", k), dos::FixedStride{k}, {}, {}, {}});
  // A control copy of each stride: streaming plans differ from copy to copy as
  // static_fraction's do, and the best fixed stride is what auto/best divides by.
  if (stride_copies)
    for (std::uint32_t k = 1; k <= 8; ++k)
      cs.push_back({fmt::format("stride_{}_again", k), dos::FixedStride{k}, {}, {}, {}});
  const auto named = [&](std::string_view name) -> const Contender& {
    return *std::find_if(cs.begin(), cs.end(), [&](const Contender& c) { return c.name == name; });
  };
  for (Contender& c : cs) {
    c.values.assign(elements, 0.5f);
    std::vector<dos::HostParam<float>> params;
    for (std::size_t off = 0; off < elements; off += kSubgroup) {
      const std::size_t n = std::min(kSubgroup, elements - off);
      params.push_back({std::span(c.values).subspan(off, n), std::span(grad).subspan(off, n)});
    }
    dos::Options o{.subgroup_elements = kSubgroup, .threads = 1};
    o.interleave.policy = c.policy;
    o.interleave.profile = m.profile;
    c.opt = std::make_unique<Optimizer>(params, dos::AdamW{}, o, m.device);
    c.opt->step();  // first touch of the state, outside the measured steps
  }
  std::string ks, rks;
  std::vector<std::size_t> group(6), block;  // indices into cs: the first six, then the rest
  std::iota(group.begin(), group.end(), std::size_t{0});
  for (std::size_t i = group.size(); i < cs.size(); ++i) block.push_back(i);
  std::mt19937 shuffle(12345);
  std::vector<std::size_t> order;
  for (int step = 0; step < s.steps; ++step) {
    if (step == s.steps / 2) {
      // Every step so far is the first half's.
      const auto index = [&](std::uint32_t k) {
        return static_cast<std::size_t>(&named(fmt::format("stride_{}", k)) - cs.data());
      };
      std::vector<std::size_t> strides;
      for (std::uint32_t k = 1; k <= 8; ++k) strides.push_back(index(k));
      std::partial_sort(strides.begin(), strides.begin() + 2, strides.end(), [&](std::size_t x, std::size_t y) {
        return median(cs[x].seconds) < median(cs[y].seconds);
      });
      for (std::size_t j = 0; j < 2; ++j) {
        group.push_back(strides[j]);
        std::erase(block, strides[j]);
      }
      if (trace) fmt::print("  from step {} in the compared group: {}, {}\n", step, cs[strides[0]].name, cs[strides[1]].name);
    }
    order.clear();
    for (std::size_t i = 0; i < block.size(); ++i) order.push_back(block[(i + static_cast<std::size_t>(step)) % block.size()]);
    std::shuffle(group.begin(), group.end(), shuffle);
    order.insert(order.end(), group.begin(), group.end());
    for (const std::size_t i : order) {
      Contender& c = cs[i];
      const dos::StepReport r = c.opt->step();
      c.seconds.push_back(r.seconds);
      c.measured.push_back(r.update_seconds);
      c.strides.push_back(r.device_subgroups > r.resident_subgroups ? r.stride : 0);
      c.residents.push_back(r.resident_subgroups);
      if (trace && c.name == "automatic") ks += fmt::format(" {}{}", r.stride, r.explored ? "E" : "");
      if (trace && c.name == "resident_then_stride")
        rks += fmt::format(" r{}k{}{}", r.resident_subgroups, c.strides.back(), r.explored ? "E" : "");
    }
  }
  if (trace) fmt::print("  automatic k by step:{}\n  resident_then_stride by step:{}\n", ks, rks);
  if (trace) {
    // Each automatic step's time over the fixed contender of the same plan in that
    // round: near 1 when what the policy measured is what that plan takes.
    const Contender& a = named("automatic");
    std::string line;
    for (std::size_t i = 0; i < a.seconds.size(); ++i) {
      const std::uint32_t k = a.strides[i];
      const Contender& same = k == 0 ? named("all_cpu") : named(fmt::format("stride_{}", k));
      line += fmt::format(" {}:{:.1f}/{:.2f}", k, a.seconds[i] * 1e3, a.seconds[i] / same.seconds[i]);
    }
    fmt::print("  automatic ms / same plan's fixed contender, by step:{}\n", line);
  }
  if (trace) {
    // Each resident_then_stride step over static_fraction's and all-CPU's in that round:
    // where it settled on static_fraction's count with nothing streamed, the first
    // should be near 1.
    const Contender& rts = named("resident_then_stride");
    const Contender& sf = named("static_fraction");
    const Contender& cpu = named("all_cpu");
    std::string line;
    for (std::size_t i = 0; i < rts.seconds.size(); ++i)
      line += fmt::format(" {:.1f}/{:.2f}/{:.2f}", rts.seconds[i] * 1e3, rts.seconds[i] / sf.seconds[i],
                          rts.seconds[i] / cpu.seconds[i]);
    fmt::print("  resident_then_stride ms / static_fraction's / all-CPU's, by step:{}\n", line);
    // What the policy measured: the update alone. A step's time above also holds the
    // move of residents that follows it, so in a duel every second step carries one.
    line.clear();
    for (std::size_t i = 0; i < rts.measured.size(); ++i) line += fmt::format(" {:.1f}", rts.measured[i] * 1e3);
    fmt::print("  resident_then_stride update ms as the policy measured it, by step:{}\n", line);
  }
  if (trace) {
    std::string lates;
    for (const Contender& c : cs) lates += fmt::format(" {} {:.2f}", c.name, late_median(c) * 1e3);
    fmt::print("  last-half medians, ms:{}\n", lates);
  }
  // The best fixed contender is the one with the shortest median step over the last
  // half (all-CPU or a stride; for resident_then_stride, static_fraction too); each
  // ratio is the median over the late steps of the two contenders' times in the same
  // round. The same choice made over the first half is what a policy that knew that
  // half exactly would have kept: where the machine changed during the run, the plan
  // fastest then need not be fastest later.
  const auto fastest = [&](bool late) {
    const Contender* fixed = &named("all_cpu");
    for (std::uint32_t k = 1; k <= 8; ++k) {
      const Contender& c = named(fmt::format("stride_{}", k));
      if (half_median(c, late) < half_median(*fixed, late)) fixed = &c;
    }
    const Contender& sf = named("static_fraction");
    return std::pair{fixed, half_median(sf, late) < half_median(*fixed, late) ? &sf : fixed};
  };
  const auto [best, any_best] = fastest(true);
  const auto [early, any_early] = fastest(false);
  RunResult out;
  out.raw.auto_best = paired(named("automatic"), *best);
  out.raw.auto_cpu = paired(named("automatic"), named("all_cpu"));
  out.raw.rts_sf = paired(named("resident_then_stride"), named("static_fraction"));
  out.raw.rts_best = paired(named("resident_then_stride"), *any_best);
  out.raw.rts_cpu = paired(named("resident_then_stride"), named("all_cpu"));
  out.early = early->name;
  out.rts_early = any_early->name;
  out.early_best = paired(*early, *best);
  out.early_cpu = paired(*early, named("all_cpu"));
  out.rts_early_best = paired(*any_early, *any_best);
  out.rts_early_cpu = paired(*any_early, named("all_cpu"));
  const auto& rts = named("resident_then_stride");
  out.rts_settled = rts.opt->policy().target<dos::ResidentThenStride>()->explorer.settled_after();
  out.residents = rts.opt->policy().target<dos::ResidentThenStride>()->explorer.chosen();
  out.raw.cpu_cpu = paired(named("all_cpu_again"), named("all_cpu"));
  out.sf_sf = paired(named("static_fraction_again"), named("static_fraction"));
  out.best = best->name;
  out.best_best = best->name == "all_cpu" ? out.raw.cpu_cpu
                  : stride_copies         ? paired(named(best->name + "_again"), *best)
                                          : std::numeric_limits<double>::quiet_NaN();
  // The same plan on the policy's copy and on the fixed contender's: what of a ratio
  // above is the copy, not the choice. resident_then_stride's steps count where they
  // ran static_fraction's plan (its count, nothing streamed) or a plan with no
  // residents, with no move of residents right before or after (a step's time holds
  // the move that follows it, and the step after a move reads part of the way towards
  // the count left).
  const auto same_plan = [&](const Contender& p, auto fixed_of, double& ratio, std::size_t& steps) {
    std::vector<double> r;
    for (std::size_t i = p.seconds.size() / 2; i < p.seconds.size(); ++i)
      if (const Contender* f = fixed_of(i)) r.push_back(p.seconds[i] / f->seconds[i]);
    steps = r.size();
    ratio = r.empty() ? std::numeric_limits<double>::quiet_NaN() : median(r);
  };
  const Contender& a = named("automatic");
  const auto fixed_at = [&](std::uint32_t k) { return &(k == 0 ? named("all_cpu") : named(fmt::format("stride_{}", k))); };
  same_plan(a, [&](std::size_t i) { return fixed_at(a.strides[i]); }, out.auto_same, out.auto_same_steps);
  const std::size_t sf_count =
      named("static_fraction").opt->policy().target<dos::StaticFraction>()->count((elements + kSubgroup - 1) / kSubgroup);
  same_plan(
      rts,
      [&](std::size_t i) -> const Contender* {
        const std::size_t r = rts.residents[i];
        if (i + 1 >= rts.residents.size() || rts.residents[i - 1] != r || rts.residents[i + 1] != r) return nullptr;
        if (r == 0) return fixed_at(rts.strides[i]);
        return r == sf_count && rts.strides[i] == 0 ? &named("static_fraction") : nullptr;
      },
      out.rts_same, out.rts_same_steps);
  out.settled = a.opt->policy().target<dos::AutomaticStride>()->explorer.settled_after();
  out.k = a.opt->timeline().plan.stride;
  // The placement check: every copy runs the same plan, all-CPU, in one order shuffled
  // afresh each round (residents move back to the host when the policy is set). The
  // first two rounds are not counted: a copy's first all-CPU step after streaming or
  // keeping residents may still be settling.
  for (Contender& c : cs) c.opt->set_policy(dos::AllCpu{});
  const auto over = bench::over_round_median(cs.size(), kPlacementRounds + 2, 2, shuffle,
                                             [&](std::size_t i) { return cs[i].opt->step().seconds; });
  for (std::size_t i = 0; i < cs.size(); ++i) cs[i].placement = median(over[i]);
  if (trace) {
    std::string line;
    for (const Contender& c : cs) line += fmt::format(" {} {:.3f}", c.name, c.placement);
    fmt::print("  placement (all-CPU step over the median copy's):{}\n", line);
  }
  const auto placed = [&](double ratio, const Contender& x, const Contender& y) { return ratio * y.placement / x.placement; };
  out.placed = {placed(out.raw.auto_best, a, *best), placed(out.raw.auto_cpu, a, named("all_cpu")),
                placed(out.raw.rts_best, rts, *any_best), placed(out.raw.rts_cpu, rts, named("all_cpu")),
                placed(out.raw.rts_sf, rts, named("static_fraction")),
                placed(out.raw.cpu_cpu, named("all_cpu_again"), named("all_cpu"))};
  return out;
}

// Whether the control copies of the fixed strides run at this size. Each contender
// holds its own model: 22 of them at 16M parameters peaked at 6.2 GB of resident
// memory on the Zen 5 VM (about 17 B per parameter each: values, Adam's state, the
// emulated device's homes and staging), so at 64M the copies would take the 22
// contenders past a 24 GiB machine, where the kernel killed the bench in its fourth
// run. Without them 14 contenders run, and the k/k column says "off".
bool stride_copies_fit(const Settings& s, std::size_t elements) {
  if (s.stride_copies >= 0) return s.stride_copies == 1;
  constexpr double kBytesPerParameter = 18;  // per contender, measured above, rounded up
  const double need = 22 * kBytesPerParameter * static_cast<double>(elements);
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (need <= 0.8 * have) return true;
  fmt::print("  {}M parameters: no control copies of the strides (22 copies of the model need about {:.1f} GiB, "
             "over 80% of this machine's {:.1f} GiB; --stride-copies yes runs them anyway)\n",
             static_cast<double>(elements) / (1 << 20), need / (1u << 30), have / (1u << 30));
  return false;
}

// "median (worst)" of a list of ratios.
std::string spread(const std::vector<double>& v) {
  return fmt::format("{:.3f} ({:.3f})", median(v), *std::max_element(v.begin(), v.end()));
}

// "median [least-most] n/runs" of the runs' same-plan ratios, those with such steps;
// "-" where no run had any.
std::string same_range(std::vector<double> v, int runs) {
  std::erase_if(v, [](double x) { return std::isnan(x); });
  if (v.empty()) return "-";
  const auto [least, most] = std::minmax_element(v.begin(), v.end());
  return fmt::format("{:.3f} [{:.3f}-{:.3f}] {}/{}", median(v), *least, *most, v.size(), runs);
}

// "median [least-worst]" of a control's ratios; "off" where the control did not run.
std::string range(const std::vector<double>& v) {
  if (v.empty()) return "off (no stride copies)";
  const auto [least, most] = std::minmax_element(v.begin(), v.end());
  return fmt::format("{:.3f} [{:.3f}-{:.3f}]", median(v), *least, *most);
}

}  // namespace

int main(int argc, char** argv) {
  const Settings s = parse(argc, argv);
  fmt::print("{} runs of {} steps; medians of paired ratios over the last half; median (worst) over the runs\n",
             s.runs, s.steps);
  fmt::print("{:>5} {:>6} | {:>13} | {:>13} | {:>7} | {:>9} | {:>9} | {:>13} | {:>13} | {:>13} | {:>7} | {:>9} | {:>9} | {:>19} | {:>21} | {:>21} | {:>22} | {:>7} | {:>7} | {:>25} | {:>25} | {:>16} | {:>15} | {:>5} | {:>15} | {:>14} | {:>13} | {:>5} | {:>21}\n",
             "link", "params", "auto/best", "auto/cpu", "met", "settled", "final k", "rts/best", "rts/cpu", "rts/sf",
             "met", "settled", "residents", "best fixed", "cpu/cpu", "sf/sf", "k/k (best fixed)", "early", "rts early", "auto same plan", "rts same plan",
             "auto/best placed", "auto/cpu placed", "met", "rts/best placed", "rts/cpu placed", "rts/sf placed", "met",
             "cpu/cpu placed");
  const auto elements_of = [](double size) { return static_cast<std::size_t>(size * (1 << 20)); };
  std::vector<bool> copies_at;  // per size, decided (and said) once
  for (const double size : s.sizes) copies_at.push_back(stride_copies_fit(s, elements_of(size)));
  bool met = true, rts_met = true, placed_met = true, rts_placed_met = true;
  const std::vector<int> device = bench::device_cpus();
  for (const double link : s.links) {
    const dos::EmulatedLink m = dos::emulated_link(link, device);
    for (std::size_t z = 0; z < s.sizes.size(); ++z) {
      const double size = s.sizes[z];
      const std::size_t elements = elements_of(size);
      const bool copies = copies_at[z];
      const std::vector<float> grad(elements, 1e-3f);
      Columns raw, placed;  // the runs' ratios, and with each copy's placement taken out
      std::vector<double> sf_control, best_control, settled, rts_settled;
      std::vector<double> auto_same, rts_same;
      std::string ks, bests, residents;
      int early_ok = 0, rts_early_ok = 0;  // runs where the first half's best would have met them
      for (int run = 0; run < s.runs; ++run) {
        if (s.trace) fmt::print("  run {} of link {}, {}M:\n", run + 1, link, size);
        const RunResult r = run_once(m, elements, grad, s, s.trace, copies);
        raw.add(r.raw);
        placed.add(r.placed);
        auto_same.push_back(r.auto_same);
        rts_same.push_back(r.rts_same);
        sf_control.push_back(r.sf_sf);
        if (!std::isnan(r.best_best)) best_control.push_back(r.best_best);
        settled.push_back(static_cast<double>(r.settled));
        rts_settled.push_back(static_cast<double>(r.rts_settled));
        ks += fmt::format("{}{}", run == 0 ? "" : ",", r.k);
        residents += fmt::format("{}{}", run == 0 ? "" : ",", r.residents);
        bests += fmt::format("{}{}", run == 0 ? "" : ",", r.best == "all_cpu" ? "cpu" : r.best.substr(7));
        early_ok += meets(r.early_best, r.early_cpu);
        rts_early_ok += meets(r.rts_early_best, r.rts_early_cpu);
        if (s.trace)
          fmt::print("  run {}: auto/best {:.3f} auto/cpu {:.3f} rts/best {:.3f} rts/cpu {:.3f} rts/sf {:.3f}; "
                     "first half's best {} over the best {:.3f}, over all-CPU {:.3f}; with static_fraction {} "
                     "{:.3f}, {:.3f}; same plan: automatic {:.3f} over {} steps, resident_then_stride {:.3f} over {}\n",
                     run + 1, r.raw.auto_best, r.raw.auto_cpu, r.raw.rts_best, r.raw.rts_cpu, r.raw.rts_sf, r.early, r.early_best,
                     r.early_cpu, r.rts_early, r.rts_early_best, r.rts_early_cpu, r.auto_same, r.auto_same_steps,
                     r.rts_same, r.rts_same_steps);
        if (s.trace)
          fmt::print("  run {}, placement taken out: auto/best {:.3f} auto/cpu {:.3f} rts/best {:.3f} rts/cpu {:.3f} "
                     "rts/sf {:.3f} cpu/cpu {:.3f}\n",
                     run + 1, r.placed.auto_best, r.placed.auto_cpu, r.placed.rts_best, r.placed.rts_cpu,
                     r.placed.rts_sf, r.placed.cpu_cpu);
      }
      const auto worst = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
      met = met && raw.ok == s.runs;
      rts_met = rts_met && raw.rts_ok == s.runs;
      placed_met = placed_met && placed.ok == s.runs;
      rts_placed_met = rts_placed_met && placed.rts_ok == s.runs;
      fmt::print("{:>5} {:>5}M | {:>13} | {:>13} | {:>7} | {:>3.0f} ({:>3.0f}) | {:>9} | {:>13} | {:>13} | {:>13} | {:>7} | {:>3.0f} ({:>3.0f}) | {:>9} | {:>19} | {} | {} | {:>22} | {:>7} | {:>7} | {:>25} | {:>25} | {:>16} | {:>15} | {:>5} | {:>15} | {:>14} | {:>13} | {:>5} | {:>21}\n",
                 link, size, spread(raw.best), spread(raw.cpu), fmt::format("{}/{}", raw.ok, s.runs), median(settled),
                 worst(settled), ks, spread(raw.rts_best), spread(raw.rts_cpu), spread(raw.rts_sf),
                 fmt::format("{}/{}", raw.rts_ok, s.runs), median(rts_settled), worst(rts_settled), residents, bests,
                 range(raw.control), range(sf_control), range(best_control), fmt::format("{}/{}", early_ok, s.runs),
                 fmt::format("{}/{}", rts_early_ok, s.runs), same_range(auto_same, s.runs), same_range(rts_same, s.runs),
                 spread(placed.best), spread(placed.cpu), fmt::format("{}/{}", placed.ok, s.runs), spread(placed.rts_best),
                 spread(placed.rts_cpu), spread(placed.rts_sf), fmt::format("{}/{}", placed.rts_ok, s.runs),
                 range(placed.control));
      std::fflush(stdout);
    }
  }
  fmt::print("targets (auto/best <= 1.05 and auto/cpu <= 1.02 in every run): {}\n", met ? "met" : "NOT met");
  fmt::print("targets (rts/best <= 1.05 and rts/cpu <= 1.02 in every run): {}\n", rts_met ? "met" : "NOT met");
  fmt::print("with each copy's placement taken out: automatic {}, resident_then_stride {}\n", placed_met ? "met" : "NOT met",
             rts_placed_met ? "met" : "NOT met");
  return 0;
}
