#pragma once
/// @file
/// @brief `StrideExplorer`: chooses a step's stride from what the steps that ran each
///        stride measured, and explores, at a bounded cost, the strides it has not
///        measured or whose measurements are old. The cost model predicts well what
///        it has measured and can be wrong, in either direction, about what it has
///        not; so measurements decide, and the model only says what is worth trying
///        (docs/design.md, "Choosing the split").

#include "dos/error.hpp"
#include "dos/schedule/plan.hpp"
#include "dos/schedule/policy.hpp"
#include "dos/schedule/timeline.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace dos {

namespace detail {
/// Sorts the first @p n of a few numbers in place: an insertion sort, since std::sort
/// trips GCC 12's -Warray-bounds on arrays this small.
template <std::size_t N>
constexpr void sort_first(std::array<double, N>& x, std::size_t n) noexcept {
  for (std::size_t i = 1; i < n; ++i)
    for (std::size_t j = i; j > 0 && x[j - 1] > x[j]; --j) std::swap(x[j - 1], x[j]);
}

/// The wait before a challenger that lost again may challenge again: twice the last,
/// from @p first up to @p most steps (never below @p first, should @p most be less).
/// A challenger that keeps losing thus costs ever fewer steps, while one whose time
/// came is still heard within @p most.
constexpr std::int64_t doubled_wait(std::int64_t last, std::int64_t first, std::int64_t most) noexcept {
  return std::min(std::max(2 * last, first), std::max(first, most));
}

/// The largest stride worth a record: one past the subgroups streams what the last does.
inline std::uint32_t candidates(std::uint32_t max_stride, std::size_t subgroups) {
  return static_cast<std::uint32_t>(std::min<std::size_t>(max_stride, subgroups));
}

/// The score of a duel: pairs of times, the incumbent's then the challenger's, each a
/// step, and the verdict on them (docs/design.md, "Choosing the split").
///
/// In a duel that confirms, a challenger that wins the first `length` pairs plays on to
/// `confirm` pairs and must win over all of them. The explorers confirm where the
/// incumbent is established (a challenge, or a re-check, of a settled choice): on the
/// Zen 5 VM one step in eight or so runs 1.2-2.5x slower for reasons of its own, and a
/// stride 10% slower than all-CPU won a re-check's four pairs, its lucky steps against
/// all-CPU's unlucky ones, and kept the place for the twenty steps until the return
/// match. The longer verdict cuts such wins about sixfold (a 10% slower challenger on
/// a simulation of that noise: 3.4% of duels won in four pairs, 0.6% after eight) and
/// delays a real win by four pairs. Duels while settling (playoffs, the residency's
/// search) and return matches do not confirm (a split verdict, below, plays on in every
/// duel): there no choice is established yet, or
/// the one just made may be the lucky one, and each confirmation would delay settling
/// (on the scripted noisy machines of test_explorer, 20-23% of runs settled after step
/// 40 instead of 7-10% when every duel confirmed).
struct DuelScore {
  static constexpr std::size_t length = 4;   ///< pairs before the first verdict
  static constexpr std::size_t confirm = 8;  ///< pairs a challenger that won them must win over
  static constexpr std::size_t clear = 3;    ///< pairs after which a clear win ends it
  static constexpr double margin = 0.01;     ///< what a challenger must win by, as a fraction

  std::array<std::array<double, confirm>, 2> times{};  // incumbent, challenger
  std::size_t pairs = 0;
  bool confirming = false;  // a win of the first `length` pairs plays on
  bool split = false;       // the first `length` pairs were split: the duel plays on

  void restart(bool confirm_a_win = false) noexcept {
    pairs = 0;
    confirming = confirm_a_win;
    split = false;
  }
  /// Records one pair; returns whether the duel is over, and then sets @p won.
  bool add(double incumbent, double challenger, bool& won) noexcept {
    times[0][pairs] = incumbent;
    times[1][pairs] = challenger;
    ++pairs;
    if (pairs == clear && clear_win()) return won = true;
    if (pairs < length || (pairs > length && pairs < confirm)) return false;
    won = challenger_won();
    // A split verdict plays on to `confirm` pairs. The challenger's fastest steps won
    // but the median did not: two of its four steps were slow ones. On the Zen 5 VM a
    // streaming step runs 1.2-1.4x slow about one time in five, and a stride 10% faster
    // than all-CPU lost duels to it (bench_automatic at link 2: three losses in a row
    // kept all-CPU running for 80 steps). On a simulation of that noise such a stride
    // lost 17% of four-pair duels, 5% with a split played on; a challenger as fast as
    // the incumbent won 3.4% either way: it hardly ever splits, as its fastest steps
    // must beat the incumbent's.
    if (!won && pairs == length && fastest_won()) split = true;
    if (split && pairs < confirm) return false;
    return !won || !confirming || pairs == confirm;
  }

  /// The fastest of one side's steps so far (0: the incumbent's, 1: the challenger's);
  /// infinite before the first pair.
  double fastest(std::size_t side) const noexcept {
    double f = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < pairs; ++i) f = std::min(f, times[side][i]);
    return f;
  }

  /// The median of the pairs' ratios so far, the challenger's time over the
  /// incumbent's; 1 before the first pair.
  double median_ratio() const noexcept {
    std::array<double, confirm> r{};
    for (std::size_t i = 0; i < pairs; ++i) r[i] = times[1][i] / times[0][i];
    sort_first(r, pairs);
    if (pairs == 0) return 1;
    return pairs % 2 == 1 ? r[pairs / 2] : 0.5 * (r[pairs / 2 - 1] + r[pairs / 2]);
  }

  /// After `clear` pairs: whether every one of the challenger's times lost to every
  /// one of the incumbent's by the margin (a verdict no fourth pair would change).
  bool clear_loss() const noexcept {
    const double* c = times[1].data();
    const double* i = times[0].data();
    return (1 - margin) * *std::min_element(c, c + clear) > *std::max_element(i, i + clear);
  }

  // The verdict on the pairs so far (an even number): the challenger must win by the
  // margin both ways, by its two fastest times against the incumbent's (which no one or
  // two slow steps move) and by the median of the pairs' ratios (which a phase of the
  // machine that began or ended during the duel does not move).
  bool challenger_won() const noexcept { return fastest_won() && median_ratio() < 1 - margin; }

  // Whether the challenger's two fastest times beat the incumbent's by the margin.
  bool fastest_won() const noexcept {
    std::array<double, confirm> challenger = times[1], incumbent = times[0];
    sort_first(challenger, pairs);
    sort_first(incumbent, pairs);
    return challenger[0] + challenger[1] < (1 - margin) * (incumbent[0] + incumbent[1]);
  }

  // After `clear` pairs, a challenger whose every time beat every one of the
  // incumbent's by the margin has won: a machine that changed needs no longer duels to
  // follow, and that many slow steps of the incumbent in a row are rare.
  bool clear_win() const noexcept {
    const double* c = times[1].data();
    const double* i = times[0].data();
    return *std::max_element(c, c + clear) < (1 - margin) * *std::min_element(i, i + clear);
  }
};
}  // namespace detail

/// @brief How a measured choice explores; the defaults suit steps of milliseconds to
///        seconds, thousands of steps long.
struct ExploreSettings {
  /// Once every candidate worth trying has been measured, at most one step in this
  /// many re-checks a candidate other than the best; also the steps before a return
  /// match, and the first wait after a lost duel (see `StrideExplorer`); >= 1.
  std::uint32_t explore_every = 16;
  /// A candidate close to the best is re-checked this many steps after it was last
  /// measured; slower ones proportionally later; also the longest wait after lost
  /// duels (see `StrideExplorer`); >= 1.
  std::uint32_t stale_after = 200;
  /// Never explore a candidate estimated more than this many times slower than the
  /// best measured one; >= 1.
  double max_slowdown = 2;
  /// Candidates within this fraction of the best are measured `min_samples` times
  /// before the choice trusts them, and re-checked when stale; >= 0.
  double close = 0.25;

  /// @throws std::invalid_argument naming the bad field.
  void validate() const {
    if (explore_every < 1) throw_invalid_argument("policy explore_every must be >= 1, got {}", explore_every);
    if (stale_after < 1) throw_invalid_argument("policy stale_after must be >= 1, got {}", stale_after);
    if (!(max_slowdown >= 1)) throw_invalid_argument("policy max_slowdown must be >= 1, got {}", max_slowdown);
    if (!(close >= 0)) throw_invalid_argument("policy close must be >= 0, got {}", close);
  }
};

/// @brief The strides 0 (no streaming) to `max_stride` of one residency, each with the
///        medians of its last measured steps; chooses the fastest measured, explores
///        the others one at a time, and, once settled, changes its choice only when
///        another candidate beats it side by side.
///
/// **The sweep.** Each step, every candidate's estimate is the median of its last
/// `window` measured update times (a median, so one slow step does not move it), or
/// the cost model's prediction while it has none. The step runs the candidate with
/// the lowest estimate, unless exploring is due: then it runs the nearest (in k) of
/// the best candidates that are worth measuring: those never measured, those close to
/// the best and measured fewer than `min_samples` times, then those measured once
/// within twice `close` (one step of a shared machine is no verdict), and those whose
/// last measurement is stale (after `stale_after` steps if it was close to the best or the
/// refined model's prediction for it fell by more than `close` since, proportionally
/// later the slower it measured). Nothing estimated more than `max_slowdown` times
/// slower than the best measured candidate is ever explored (all-CPU is judged by the
/// lowest of its estimate, the model's prediction now and before its first step, and
/// its fastest kept step). While candidates remain
/// unmeasured, exploring is due every step (the model's guess is not yet checked);
/// afterwards at most once in `explore_every` steps, so re-checking a candidate costs
/// on average at most `close / stale_after` of a step (0.125% by default).
///
/// **Duels.** Medians from different times do not compare on a machine whose speed
/// changes: a run of slow steps raises the running candidate's median and leaves
/// the others' as they were measured, in quieter times. So once the sweep is over
/// (`min_samples` steps per candidate), the running candidate (the *incumbent*) gives
/// its place up only to a candidate that beat it in a *duel*: `duel_length` pairs of
/// steps, the incumbent then the challenger, the challenger winning only if by more
/// than `duel_margin` both by its two fastest steps against the incumbent's (steps are
/// slowed, hardly ever sped up, by the machine's other work) and by the median of the
/// pairs' ratios (which a phase of the machine beginning mid-duel does not move), in a
/// challenge (below) then again over `confirm_pairs` pairs (against a settled choice,
/// one lucky run of four steps is no verdict), and over `confirm_pairs` in any duel
/// whose four pairs split (its fastest steps won, the median did not: two of its
/// steps were slow ones); or, after `clear_pairs` pairs, when each
/// of its steps beat each of the incumbent's by the margin. Duels are fought, in this
/// order of precedence:
/// - a *return match*, `explore_every` steps after an incumbent lost its place, for it
///   (it does not challenge before);
/// - a *challenge* (below) by a candidate that lost a duel, once its wait is over, if
///   its fastest step since still beats the incumbent's by the margin (it goes before
///   the playoffs still due, drawn only near the incumbent it was measured faster than);
/// - *playoffs*, once each, right after the sweep, for all-CPU whatever it measured
///   (it is what the policy must never be slower than, and the first steps of a run
///   can be the slowest: on the Zen 5 VM all-CPU's two sweep steps ran 1.6-2.4x its
///   later time, and without its playoff a run settled 1.35x slower than all-CPU),
///   and for the candidates whose fastest step came within `close` of the
///   incumbent's (the sweep's few steps of a candidate may all have been slow ones),
///   or, over inherited records (`inherit`), beat it by the margin (they were scaled
///   from another residency, where streaming cost otherwise; within `close` again
///   where `inherit` was asked to play off the near ones);
///   fastest first, but all-CPU's second at the latest (first, it delayed settling on
///   noisy machines; after the sweep's fastest four, it came too late where its sweep
///   steps ran slow); any
///   duel won judges those still due again, against the winner, and
///   drops those no longer near it by the same bar (all-CPU keeps its own);
/// - *challenges*, by a candidate whose fastest kept step (a re-check refreshes it)
///   beat the incumbent's by more than the margin, all-CPU first (it is what the
///   policy must never be slower than), then the fastest; they confirm a win over
///   `confirm_pairs` pairs; a challenger that loses may challenge again only after a
///   wait that doubles with each loss, from `explore_every` up to `stale_after` steps.
/// The challenger's steps in a duel count as explored. A running candidate whose
/// fastest recent step measures more than `max_slowdown` times slower than the best
/// measured one is challenged at once by that one, whatever the waits.
class StrideExplorer {
 public:
  static constexpr std::size_t window = 5;         ///< measurements kept per candidate
  static constexpr std::uint32_t min_samples = 3;  ///< before a close candidate is trusted
  static constexpr std::size_t duel_length = detail::DuelScore::length;     ///< pairs of steps before a duel's first verdict
  static constexpr std::size_t confirm_pairs = detail::DuelScore::confirm;  ///< pairs a challenger winning them plays on to
  static constexpr std::size_t clear_pairs = detail::DuelScore::clear;   ///< pairs after which a clear win ends a duel
  static constexpr double duel_margin = detail::DuelScore::margin;       ///< what a challenger must win by, as a fraction

  /// @brief What is known of one candidate.
  struct Record {
    std::array<double, window> seconds{};  ///< its last measurements, a ring
    std::uint32_t kept = 0;                ///< how many of `seconds` hold one
    std::uint32_t samples = 0;             ///< measurements ever taken
    std::int64_t last = -1;                ///< the step it was last measured in
    std::int64_t recheck_at = -1;          ///< when it is re-checked after losing its place; -1: not
    std::int64_t backoff = 0;              ///< steps to the re-check after that one
    double predicted = 0;                  ///< the model's prediction, this step
    double predicted_then = 0;             ///< the model's prediction when it was last measured
    double predicted_before = 0;           ///< the model's prediction before its first measured step
    bool feasible = false;                 ///< its plan fits the staging budget
    std::int64_t duel_at = 0;              ///< the step from which it may challenge again
    std::int64_t duel_wait = 0;            ///< the wait after its last lost duel
    bool dueled = false;                   ///< it has fought a duel, or has no playoff due
    std::uint32_t fresh_from = 0;          ///< `kept` when its last duel began
    double fastest_ever = std::numeric_limits<double>::infinity();  ///< its fastest step measured here (not inherited)
    std::uint32_t inherited = 0;           ///< how many of the first `kept` were inherited (`inherit`)
    bool discredited = false;              ///< its inherited steps were shown wrong (see `inherit`)

    /// @brief Whether every kept step was inherited: none measured here yet.
    bool all_inherited() const noexcept { return inherited > 0 && kept == inherited; }

    /// @brief Median of the kept measurements (copying: the ring keeps its order).
    double median() const noexcept {
      std::array<double, window> s = seconds;
      const std::size_t n = std::min<std::size_t>(kept, window);
      detail::sort_first(s, n);
      if (n == 0) return std::numeric_limits<double>::quiet_NaN();
      return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    }
    /// @brief The fastest kept measurement since its last duel began (the older ones
    ///        are what the duel was about): what it takes when the machine leaves it
    ///        alone, since a step is slowed, hardly ever sped up, by the machine's other
    ///        work. Infinite if there is none.
    double fastest() const noexcept { return fastest_since(fresh_from); }
    /// @brief The fastest of the kept measurements, whenever taken; infinite if none.
    double fastest_kept() const noexcept { return fastest_since(0); }
    /// @brief The fastest kept measurement from the @p from-th ever kept on; infinite
    ///        if none.
    double fastest_since(std::uint32_t from) const noexcept {
      double f = std::numeric_limits<double>::infinity();
      for (std::uint32_t i = std::max<std::uint32_t>(from, kept > window ? kept - static_cast<std::uint32_t>(window) : 0u); i < kept; ++i)
        f = std::min(f, seconds[i % window]);
      return f;
    }
    /// @brief What this candidate is believed to take: measured where it was.
    double estimate() const noexcept { return kept > 0 ? median() : predicted; }
    /// @brief What it is judged by when deciding whether it may run at all: its
    ///        estimate, but the model's prediction while it has fewer than
    ///        `min_samples` steps and each measured more than @p max_slowdown times
    ///        that. A step or two of a shared machine is no verdict: on a scripted
    ///        machine whose steps run 1.2-2.5x slow one in eight
    ///        (tests/support/scripted_policy.hpp, `heavy_tail`), all-CPU's one sweep
    ///        step fell on such a step in 2.6% of runs, put it out of reach for good,
    ///        and those runs kept a stride 10% slower to the end.
    double reach_estimate(double max_slowdown) const noexcept {
      if (kept == 0 || kept >= min_samples) return estimate();
      for (std::uint32_t i = 0; i < kept; ++i)
        if (seconds[i] <= max_slowdown * predicted) return estimate();
      return predicted;
    }
  };

  /// @brief Room for strides up to @p max_stride, so that choosing never allocates.
  void reserve(std::uint32_t max_stride) { records_.reserve(std::size_t{max_stride} + 1); }

  /// @brief Builds this step's plan into @p plan, among the strides 0..max_stride over
  ///        @p residency; returns its predicted seconds. `plan.explored` says whether
  ///        the candidate was run to measure it rather than because it is the best.
  template <class Request>
  double choose(const Request& r, std::span<const Place> residency, std::uint32_t max_stride, Plan& plan,
                Plan& scratch, const ExploreSettings& s) {
    // Strides past the streamable subgroups stream the same single subgroup as the last.
    const auto last = static_cast<std::uint32_t>(std::min<std::size_t>(max_stride, streamable(residency)));
    if (sweep_end_ == unchosen) sweep_end_ = clock_ - 1;  // the first choice since inheriting
    if (inherited_ && records_.size() != std::size_t{last} + 1) {
      // Inherited from a residency with more or fewer streamable subgroups: the strides
      // both have keep what was inherited; any new ones are swept.
      const std::size_t had = records_.size();
      records_.resize(std::size_t{last} + 1);  // within the room reserved: no allocation
      if (incumbent_ >= records_.size()) incumbent_ = none;
      if (records_.size() > had) sweep_end_ = clock_ + static_cast<std::int64_t>(min_samples * (records_.size() - had));
    } else if (records_.size() != std::size_t{last} + 1) {
      // New candidates (the first step, or a new residency): everything starts afresh.
      records_.assign(std::size_t{last} + 1, Record{});
      duel_ = last_ran_ = rematch_ = incumbent_ = none;
      playoffs_drawn_ = inherited_ = false;
      sweep_from_ = clock_;
      sweep_end_ = clock_ + static_cast<std::int64_t>(min_samples * records_.size());
    }
    std::string_view reason;
    for (std::uint32_t k = 0; k <= last; ++k) {
      Record& c = records_[k];
      c.predicted = detail::stride_plan(r, residency, scratch, k);
      if (c.samples == 0) c.predicted_before = c.predicted;
      c.feasible = k == 0 || scratch.fallback.empty();
      if (!c.feasible) reason = scratch.fallback;
    }
    stale_after_ = s.stale_after;
    explore_every_ = s.explore_every;
    max_slowdown_ = s.max_slowdown;
    close_ = s.close;
    std::uint32_t best = best_candidate();
    // A duel stops if either side no longer fits (the budget changed), and the
    // challenger loses it if its own steps put it out of reach.
    if (duel_ != none && (incumbent_ >= records_.size() || !records_[incumbent_].feasible)) duel_ = none;
    const double reach = s.max_slowdown * measured_best();
    if (duel_ != none && !within_reach(duel_, reach)) finish_duel(false);
    const bool swept = clock_ > sweep_end_;
    if (swept && incumbent_ < records_.size() && records_[incumbent_].feasible) {
      if (!playoffs_drawn_) draw_playoffs();
      if (duel_ == none) next_duel(reach);
      best = incumbent_;
    }
    bool settling = false;
    std::uint32_t target = explore_target(best, s, settling);
    // A duel: the challenger runs in the step after each step of the incumbent.
    if (duel_ != none) target = last_ran_ == incumbent_ ? duel_ : incumbent_;
    // (During the sweep the estimates choose: a new best takes the incumbent's place.)
    if (target == best && incumbent_ < records_.size() && incumbent_ != best) {
      // The best changed because the estimates moved. If the old incumbent only looked
      // slower in a slow phase of the machine, its estimate would stay stale while the
      // new one is measured in better times: re-check it soon, then less and less often.
      Record& old = records_[incumbent_];
      old.backoff = s.explore_every;
      old.recheck_at = clock_ + old.backoff;
    }
    if (target == best) {
      incumbent_ = best;
      records_[best].recheck_at = -1;  // it won its place back, or never lost it
    }
    const double t = detail::stride_plan(r, residency, plan, target);
    if (target == 0) plan.fallback = reason;  // all-CPU, and some stride did not fit
    plan.explored = target != best;
    if (plan.explored) last_explored_ = clock_;
    if (plan.explored && settling) settled_after_ = clock_ + 1;
    return t;
  }

  /// @brief Records the measured time of a step that ran one of these candidates.
  ///        @p chosen: whether this explorer chose the step (not so for a resident
  ///        count's steps in a duel of counts, `ResidencyExplorer`): one it did not
  ///        could not explore, and does not count towards the sweep of the strides
  ///        its residency added to inherited ones.
  void observe(const StepTimeline& t, bool chosen = true) {
    // (Tested before the clock moves: the step ran at clock_, a sweep step if clock_ <=
    // sweep_end_. Inherited records only: r*'s own sweep is over before its count's
    // duels begin, but for second steps of the near strides, which its window lets run
    // out during them, as before.)
    if (!chosen && inherited_ && sweep_end_ != unchosen && clock_ <= sweep_end_) ++sweep_end_;
    ++clock_;
    // A plan that streamed nothing is the all-CPU candidate, whatever was asked of it.
    const bool streamed = std::find(t.plan.placement.begin(), t.plan.placement.end(), Place::device) != t.plan.placement.end();
    const std::uint32_t k = streamed ? t.plan.stride : 0;
    if ((streamed && k == 0) || k >= records_.size() || !(t.measured_seconds > 0)) return;  // not one of ours
    Record& c = records_[k];
    if (k == duel_ && last_ran_ == incumbent_ && last_seconds_ > 0) {
      // One pair of the duel: the challenger and the incumbent in the step before.
      if (bool won = false; score_.add(last_seconds_, t.measured_seconds, won)) finish_duel(won);
    }
    last_ran_ = k;
    last_seconds_ = t.measured_seconds;
    c.seconds[c.kept % window] = t.measured_seconds;
    c.fastest_ever = std::min(c.fastest_ever, t.measured_seconds);
    c.discredited = false;
    ++c.kept;
    ++c.samples;
    c.last = clock_;
    c.predicted_then = c.predicted;  // what the model said when it chose this step
    if (t.plan.explored && c.recheck_at >= 0 && clock_ > c.recheck_at) {
      c.backoff *= 2;  // it did not win back its place (or it would run as the best)
      c.recheck_at = c.backoff <= static_cast<std::int64_t>(stale_after_) ? clock_ + c.backoff : -1;
    }
  }

  /// @brief Takes @p from's measurements (another residency's strides) as its own,
  ///        each time scaled by @p scale, as though this explorer had swept them now;
  ///        its playoffs follow, as after a sweep. If @p own is not empty, @p ran is
  ///        the stride this residency ran in the duel it won and @p own that duel's
  ///        steps: that stride keeps them instead, runs first, and, where @p from
  ///        measured it `min_samples` times, sets the scale (own median over @p from's).
  ///        A @p ran past @p from's strides is ignored. With @p play_off_near, the
  ///        playoffs are drawn as after a sweep (every stride within `close`), not
  ///        only for those that look faster: for a scale lined up on all-CPU's steps,
  ///        which says nothing of what streaming costs here.
  ///
  /// A resident count that wins its place starts from what the counts before it
  /// measured, scaled by how it compared with them, instead of sweeping the strides
  /// again: on the scripted Zen 5 machine (tests/support/scripted_policy.hpp) the sweep
  /// of nine strides cost about four steps' time, and a second one, after a return
  /// match, fell in the half of the run the bench measures. What is inherited goes
  /// stale and is re-checked as measured candidates are; if this residency has more or
  /// fewer candidates (more or fewer streamable subgroups), its first choice keeps the
  /// strides both have and sweeps the new ones. A stride that duels (a playoff or a
  /// challenge) on inherited steps and loses with its fastest duel step more than
  /// `close` slower than the inherited one that set the duel off (beyond what the
  /// incumbent's rose over its fastest step measured here) shows the scale was wrong
  /// for streaming here: the other strides still on inherited steps alone are then
  /// *discredited*, and set off no playoff or challenge, nor count towards the reach,
  /// until a re-check measures them here (docs/design.md, "A wrong scale, found in
  /// one duel"). A residency that inherits from this one judges them afresh.
  void inherit(const StrideExplorer& from, double scale, std::uint32_t ran = ~0u, std::span<const double> own = {},
               bool play_off_near = false) {
    if (from.incumbent_ >= from.records_.size() || !(scale > 0 && std::isfinite(scale))) return;  // nothing to take
    // What this residency measured itself is better evidence than what is scaled: a
    // duel won at k = 0, after no residents had beaten r* at all-CPU, must not leave
    // r*'s stride running (on the scripted Zen 5 machine, a k = 7 r*'s sweep chose by
    // lucky steps ran 1.22x slow for the rest of the run, 1.47x the best count's). And
    // the scale lines up the stride it ran: through r*'s lucky k = 7, every inherited
    // stride looked 1.22x too fast, close enough to the best to be played off one by
    // one (a review's scripted case: 1.225x the best count's late half, not 1.000).
    Record mine;
    const bool kept_own = ran < from.records_.size() && !own.empty();
    if (kept_own) {
      const std::size_t n = std::min(own.size(), window);
      std::copy(own.end() - static_cast<std::ptrdiff_t>(n), own.end(), mine.seconds.begin());
      mine.kept = mine.samples = static_cast<std::uint32_t>(n);
      if (const Record& theirs = from.records_[ran]; theirs.kept >= min_samples) {
        const double lined_up = mine.median() / theirs.median();
        if (lined_up > 0 && std::isfinite(lined_up)) scale = lined_up;
      }
    }
    records_ = from.records_;
    for (Record& c : records_) {
      const auto n = std::min<std::uint32_t>(c.kept, static_cast<std::uint32_t>(window));
      std::array<double, window> kept{};
      for (std::uint32_t i = 0; i < n; ++i) kept[i] = scale * c.seconds[(c.kept - n + i) % window];
      c.seconds = kept;
      c.kept = n;
      c.fastest_ever = std::numeric_limits<double>::infinity();  // nothing measured here yet
      c.fresh_from = 0;
      c.inherited = n;
      c.discredited = false;  // judged afresh under this scale
      c.last = n > 0 ? clock_ : -1;
      c.recheck_at = -1;
      c.backoff = c.duel_wait = 0;
      c.duel_at = clock_;
      // Predicted over the other residency: no evidence that the model moved since.
      c.predicted_then = 0;
    }
    incumbent_ = from.incumbent_;
    if (kept_own) {
      Record& c = records_[ran];
      c.seconds = mine.seconds;
      c.kept = c.samples = mine.kept;
      c.inherited = 0;
      c.fastest_ever = *std::min_element(mine.seconds.begin(), mine.seconds.begin() + mine.kept);  // kept >= 1
      c.last = clock_;
      incumbent_ = ran;
    }
    duel_ = last_ran_ = rematch_ = none;
    // Playoffs are drawn anew, over this residency: a stride the other count's sweep
    // chose by a few lucky steps would otherwise run until it went stale (on the
    // scripted Zen 5 machine, 600 steps: 115 seeds of 2000 over 5% without, 25 with).
    // Only all-CPU and the strides that look faster than the incumbent get one
    // (draw_playoffs).
    playoffs_drawn_ = false;
    // No sweep until it chooses: it may not before its count's duels end, and a step it
    // did not choose must not end a sweep it could not run (on a scripted machine,
    // two return matches in blocks right after a count won its place at the end of the
    // search ran out the sweep of the strides its fewer residents added, and two of
    // them were never measured: docs/design.md, "The fixed share's count, and the
    // strides a winner adds").
    sweep_end_ = unchosen;
    inherited_ = true;
    play_off_near_ = play_off_near;
  }

  /// @brief Whether the first sweep is over and no duel is under way: as many steps
  ///        run as there are candidates (or, for inherited records, one chosen over
  ///        them, which sweeps the strides its residency adds), and none of the last
  ///        two explored to settle. (Playoffs and re-checks may follow; the choice
  ///        is the best measured so far.)
  bool swept() const noexcept {
    // Inherited records: once chosen over (new strides, past those inherited, are swept
    // then), and none of the last two steps explored to settle.
    return duel_ == none && incumbent_ < records_.size() && clock_ >= settled_after_ + 2 &&
           (inherited_ ? sweep_end_ != unchosen : clock_ - sweep_from_ >= static_cast<std::int64_t>(records_.size()));
  }

  /// @brief Every candidate, indexed by k, as of the last choice.
  std::span<const Record> records() const noexcept { return records_; }
  /// @brief Steps observed so far.
  std::int64_t steps() const noexcept { return clock_; }
  /// @brief The last step that explored; -1 if none has.
  std::int64_t last_explored() const noexcept { return last_explored_; }
  /// @brief Steps it took to settle: the step after the last one that explored in the
  ///        sweep or that changed the running candidate after it (a duel won); 0 if
  ///        none.
  std::int64_t settled_after() const noexcept { return settled_after_; }
  /// @brief The candidate last run as the best (not to explore), or inherited as the
  ///        best (`inherit`) and not yet run; none before the first
  ///        step.
  std::optional<std::uint32_t> running() const noexcept {
    return incumbent_ < records_.size() ? std::optional(incumbent_) : std::nullopt;
  }
  /// @brief Whether a duel is being fought (a pair of its steps would be split by
  ///        steps that are not its own).
  bool dueling() const noexcept { return duel_ != none; }
  /// @brief Forgets everything measured, keeping the room reserved for the records.
  void forget() noexcept {
    std::vector<Record> keep = std::move(records_);
    keep.clear();
    *this = StrideExplorer{};
    records_ = std::move(keep);
  }

 private:
  static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();

  // The lowest estimate among the candidates measured; infinite if none is.
  double measured_best() const noexcept {
    double best = std::numeric_limits<double>::infinity();
    for (const Record& c : records_)
      if (c.feasible && c.kept > 0 && !c.discredited) best = std::min(best, c.estimate());
    return best;
  }

  // Whether candidate k may run at all: nothing slower than @p reach, `max_slowdown`
  // times the best measured estimate (judged by `Record::reach_estimate`). All-CPU is
  // judged by the lowest of the model's prediction, now or before its first step, and
  // its fastest kept step: it is what the policy must never be slower than, the model
  // predicts best the plan that streams nothing, and a step is slowed, hardly ever sped
  // up. On the EPYC VM at link 2 (2026-12-07, bench_automatic run AW, 16M, run 3)
  // all-CPU's one sweep step, the run's first, took 2.4x its later time; the median of
  // that one step put it out of reach of k = 8 (the model, refined by the same step,
  // predicted it 1.7x its time, so the odd-steps rule of `reach_estimate` did not
  // apply), it never ran again, and the late half ran 1.15x all-CPU's time. In run AX
  // (64M, run 3) the first step took 2.5x, the refined model predicted it out of reach
  // too, and its playoff waited to step 96; the prediction before that step did not.
  bool within_reach(std::uint32_t k, double reach) const noexcept {
    const Record& c = records_[k];
    if (!c.feasible) return false;
    if (k == 0 && std::min({c.predicted, c.predicted_before, c.fastest_kept()}) <= reach) return true;
    return c.reach_estimate(max_slowdown_) <= reach;
  }

  // The candidate with the lowest estimate; during a sweep, the one that runs. After
  // inheriting, not a stride (k = 0, all-CPU, excepted, and the incumbent) with fewer
  // than `min_samples` steps measured here beside its inherited ones: one factor
  // scales those, and where they streamed a few subgroups there they may stream all
  // of them here (one step measured here leaves the median on the inherited ones).
  // Such a stride takes the place only by winning a duel (its playoff). On the EPYC
  // VM at 64M parameters, link 2 (2026-12-07, bench_automatic run 2), no residents
  // took the strides of the model's 60 of 64, where k = 1 to 4 streamed 1-4 subgroups
  // and measured within 15% of k = 0; scaled, k = 4 and k = 1 looked faster than no
  // residents' own all-CPU steps and ran as the best while its new strides were
  // swept: k = 1, streaming all 64 subgroups, in 14 steps at 2.9-7.4x all-CPU's time,
  // and 15 residents' return match was fought at it (12 steps more).
  std::uint32_t best_candidate() const {
    std::uint32_t best = 0;
    for (std::uint32_t k = 1; k < records_.size(); ++k) {
      const Record& c = records_[k];
      const bool scaled = inherited_ && c.inherited > 0 && c.kept - c.inherited < min_samples;
      if (!c.feasible || (scaled && k != incumbent_)) continue;
      if (c.estimate() < records_[best].estimate()) best = k;
    }
    return best;
  }

  // The candidate to run: the best, or the one to measure if exploring is due.
  std::uint32_t explore_target(std::uint32_t best, const ExploreSettings& s, bool& settling) const {
    // The first step runs the model's best: if the model is right, nothing is lost.
    const double known = measured_best();
    if (!std::isfinite(known)) return best;
    const double best_estimate = records_[best].estimate();
    // How urgently candidate k should run: 0 not at all; unmeasured and unsettled
    // candidates first, nearest to the best first; then stale ones, most overdue first.
    constexpr double unsettled = 1e18;
    const auto urgency = [&](std::uint32_t k) {
      const Record& c = records_[k];
      if (k == best || !within_reach(k, s.max_slowdown * known)) return 0.0;
      const bool close = c.estimate() <= (1 + s.close) * best_estimate;
      // Settling, while the first sweep lasts (a few steps per candidate): candidates
      // never measured, close ones measured too few times to trust, then those whose
      // one step came within twice `close` (a step of a shared VM may run 1.3-1.5x
      // slow, whatever it runs: one is no verdict). Later such a candidate (one the
      // model had ruled out may come within reach when the machine slows) waits its
      // turn like a stale one, as if measured before the first step.
      const bool sweep = clock_ <= sweep_end_;
      const double nearness = -std::abs(static_cast<double>(k) - static_cast<double>(best));
      if (sweep && (c.samples == 0 || (close && c.samples < min_samples))) return unsettled + nearness;
      // (The second step of a near one comes after those: by then the best is known.)
      const bool near = c.estimate() <= (1 + 2 * s.close) * best_estimate;
      if (sweep && near && c.samples < 2) return 0.75 * unsettled + nearness;
      // A candidate that lost its place recently is re-checked on its backoff schedule.
      // (Only if close: no slow phase of this machine makes a plan look 25% slower.)
      if (close && c.recheck_at >= 0 && clock_ >= c.recheck_at) return 1e9 + static_cast<double>(clock_ - c.recheck_at);
      // Re-checked when stale (the machine may have changed in a way the running plan
      // does not show): after stale_after steps if close to the best or if the refined
      // model now predicts it faster, later the slower it measured, so that each
      // candidate's re-checks cost at most `close / stale_after` of a step on average.
      const double excess = c.estimate() / best_estimate - 1;
      const double stale = s.stale_after;
      // The model "now predicts it faster" when its refined rates moved its prediction
      // down by more than `close` since it was measured (a model that was always
      // optimistic about it proves nothing).
      const bool model_moved = c.predicted < (1 - s.close) * c.predicted_then && c.predicted < best_estimate;
      const double wait = model_moved || excess <= s.close ? stale : stale * excess / s.close;
      const auto age = static_cast<double>(clock_ - c.last);
      return age >= wait ? 1 + age / wait : 0.0;
    };
    std::uint32_t target = none;
    double most = 0;
    for (std::uint32_t k = 0; k < records_.size(); ++k)
      if (const double u = urgency(k); u > most) most = u, target = k;
    settling = most >= unsettled / 2;
    if (target == none) return best;
    const bool due = settling || clock_ - last_explored_ >= static_cast<std::int64_t>(s.explore_every);
    return due ? target : best;
  }

  // Right after the sweep: which candidates get a playoff (see the class comment).
  // After inheriting, all-CPU and those whose scaled fastest step beat the incumbent's:
  // one factor scales every inherited stride, but what streaming costs next to k = 0
  // differs between residencies. On the Zen 5 VM at 64M parameters (2026-12-04) the
  // strides r*'s sweep found within `close` of k = 0 ran 1.3-1.4x k = 0's time over
  // the count that inherited them, and their playoffs (4-12 steps after step 60 in
  // 9 of 20 runs, at links 0.6-2) weighed on the late half as much as a wrong count.
  // But where the scale was lined up on all-CPU's steps (`play_off_near_`: no
  // residents, which streamed nothing in its duel), nothing says whether streaming
  // costs more or less here than where it was measured, and the near strides are
  // played off as after a sweep.
  void draw_playoffs() {
    playoffs_drawn_ = true;
    played_off_ = 0;
    for (std::uint32_t k = 0; k < records_.size(); ++k) records_[k].dueled = !(records_[k].kept > 0 && worth_a_playoff(k));
  }

  // Whether candidate k is near enough the incumbent for a playoff: all-CPU always,
  // the others by their fastest step against the incumbent's (within `close`, or
  // beating it by the margin over inherited records: see above). Judged when drawn,
  // and again whenever a duel puts a new incumbent in place: those near only the one
  // it beat would cost their steps for nothing. On the scripted Xeon machine
  // (tests/support/scripted_policy.hpp, `xeon_16m`), k = 8 won its place from 6 or 7
  // in the playoffs, then defended it against 4 and 5, drawn against that incumbent
  // and 1.38x k = 8's time: up to 16 of the 60 steps of the late half. Over 2000 seeds
  // of 120 steps, 68 runs came out more than 2% over k = 8 and 14 more than 5%; judged
  // again, 17 and 3 (tests/explorer_seeds).
  bool worth_a_playoff(std::uint32_t k) const noexcept {
    const double bar = inherited_ && !play_off_near_ ? 1 - duel_margin : 1 + close_;
    return k == 0 || records_[k].fastest() <= bar * records_[incumbent_].fastest();
  }

  // Starts the next duel due, if one is (see the class comment for the order).
  void next_duel(double reach) {
    const auto eligible = [&](std::uint32_t k) { return k != incumbent_ && records_[k].kept > 0 && within_reach(k, reach); };
    std::uint32_t challenger = none;
    if (const double f = records_[incumbent_].fastest(); std::isfinite(f) && f > reach) {
      // The running candidate fell far behind the best measured one (the machine
      // changed): that one challenges it now, whatever the waits. Judged by its
      // fastest recent step, not its median: in a phase of a shared machine where
      // every other step runs 1.5-3x slow its median rises past twice the others',
      // measured before, while what it takes when left alone has not changed.
      double lowest = std::numeric_limits<double>::infinity();
      for (std::uint32_t k = 0; k < records_.size(); ++k)
        if (eligible(k) && !records_[k].discredited && records_[k].estimate() < lowest)
          lowest = records_[k].estimate(), challenger = k;
      if (challenger != none) return start_duel(challenger);
    }
    if (rematch_ == incumbent_) rematch_ = none;  // it won its place back meanwhile
    if (rematch_ != none && clock_ >= rematch_at_ && eligible(rematch_))  // else it stays due
      return start_duel(std::exchange(rematch_, none));
    // A challenge, all-CPU first, then the fastest, from the candidates @p may.
    const auto challenge = [&](auto may) {
      std::uint32_t found = none;
      double lowest = (1 - duel_margin) * records_[incumbent_].fastest();
      for (std::uint32_t k = 0; k < records_.size() && found != 0; ++k)
        if (eligible(k) && may(records_[k]) && clock_ >= records_[k].duel_at && records_[k].fastest() < lowest)
          lowest = records_[k].fastest(), found = k;
      if (found != none) start_duel(found, /*confirm=*/true);
      return found != none;
    };
    // A loser whose wait is over and whose steps since still beat the incumbent's goes
    // before the playoffs still due: they were drawn near the incumbent, and it was
    // measured faster. On the Xeon VM (run AM, link 1, 16M, run 3) k = 8, the best
    // fixed stride by 8%, lost a split playoff to all-CPU; the playoffs of 6, 7, 5 and
    // 4 then ran for 40 steps, 4 and 5 at 1.23x all-CPU's time, while k = 8's
    // challenge waited from step 59 to step 84.
    if (challenge([](const Record& r) { return r.duel_wait > 0; })) return;
    // The playoffs, fastest first, except all-CPU's, which comes second at the latest.
    // On the EPYC VM at link 2 (run AV, 2026-12-07) the sweep's all-CPU steps ran slow,
    // and the playoffs of k = 4-7 ran before its own while stride 7 or 8 held the
    // place to step 87-105. Run first, its playoff cost the runs where the sweep was
    // right about the strides (tests/explorer_seeds, 1000 seeds of 120 steps: on
    // `xeon_16m` 12 runs over 2% instead of 5); second, after the nearest stride's,
    // it cut `epyc_link2`'s from 51 to 21 for 9 on `xeon_16m` (none over 5%).
    double lowest = std::numeric_limits<double>::infinity();
    if (played_off_ > 0 && eligible(0) && !records_[0].dueled)
      challenger = 0;
    else
      for (std::uint32_t k = 0; k < records_.size(); ++k)
        if (eligible(k) && !records_[k].dueled && records_[k].fastest() < lowest) lowest = records_[k].fastest(), challenger = k;
    if (challenger != none) {
      ++played_off_;
      return start_duel(challenger);
    }
    challenge([](const Record&) { return true; });
  }

  // The challenger's kept times are what is in doubt: its fastest step is taken from
  // the duel's steps on. The incumbent runs first, so that no step of it from before
  // the duel (perhaps a slow one that set the challenge off) is in the first pair.
  void start_duel(std::uint32_t k, bool confirm = false) {
    duel_ = k;
    duel_from_ = records_[k].fastest();
    duel_on_inherited_ = records_[k].all_inherited();
    score_.restart(confirm);
    last_ran_ = none;
    records_[k].dueled = true;
    records_[k].fresh_from = records_[k].kept;
  }

  // The duel's verdict: the challenger takes the incumbent's place if it @p won, and
  // the old incumbent gets a return match (unless one is pending: a chain of wins
  // follows a machine that changed, and the first incumbent gets its match), before
  // which it does not challenge; the loser may challenge again only after a wait
  // that doubles.
  void finish_duel(bool won) {
    Record& c = records_[duel_];
    if (won) {
      settled_after_ = clock_;
      if (rematch_ == none) rematch_ = incumbent_, rematch_at_ = clock_ + explore_every_;
      Record& old = records_[incumbent_];
      old.dueled = true;  // its return match stands for its playoff
      old.duel_at = clock_ + explore_every_;
      incumbent_ = duel_;
      c.duel_wait = 0;
      // The playoffs still due are judged again, against the winner (see draw_playoffs).
      for (std::uint32_t k = 0; k < records_.size(); ++k)
        if (!records_[k].dueled && !worth_a_playoff(k)) records_[k].dueled = true;
    } else {
      c.duel_wait = detail::doubled_wait(c.duel_wait, explore_every_, stale_after_);
      c.duel_at = clock_ + c.duel_wait;
      // A stride that dueled on inherited steps and lost by far: the scale was wrong
      // for streaming here (see `inherit`). Its fastest duel step is compared with the
      // inherited one that set the duel off, the incumbent's with its fastest step
      // measured here: a phase of the machine that slows every plan raises both alike.
      const double challenger_rose = score_.fastest(1) / duel_from_;
      const double incumbent_rose = score_.fastest(0) / records_[incumbent_].fastest_ever;
      if (duel_ != 0 && duel_on_inherited_ && score_.pairs > 0 && challenger_rose > (1 + close_) * incumbent_rose)
        for (std::uint32_t k = 1; k < records_.size(); ++k)
          if (Record& other = records_[k]; k != incumbent_ && k != duel_ && other.all_inherited()) {
            other.fresh_from = other.kept;  // no challenge or playoff on them
            other.discredited = true;       // nor a place in the reach, or a forced challenge
          }
    }
    duel_ = none;
  }

  std::vector<Record> records_;
  std::uint32_t duel_ = none;          // the candidate challenging the incumbent; none: no duel
  detail::DuelScore score_;            // the duel's steps so far
  bool playoffs_drawn_ = false;        // who meets the incumbent after the sweep is decided
  std::uint32_t played_off_ = 0;       // the playoffs started since they were drawn
  bool inherited_ = false;             // the records are another residency's (inherit)
  bool play_off_near_ = false;         // and all near the incumbent get a playoff (inherit)
  std::int64_t sweep_from_ = 0;        // the step the records last started afresh
  static constexpr std::int64_t unchosen = std::numeric_limits<std::int64_t>::max();
  std::int64_t sweep_end_ = 0;         // the last step of the sweep; unchosen: inherited, not chosen over since
  std::uint32_t rematch_ = none;       // the incumbent that lost its place in a duel
  std::int64_t rematch_at_ = 0;        // when it gets its return match
  std::uint32_t last_ran_ = none;      // the candidate the last observed step ran
  double last_seconds_ = 0;            // and what it took
  std::int64_t clock_ = 0;
  std::int64_t last_explored_ = -1;
  std::int64_t settled_after_ = 0;
  std::uint32_t incumbent_ = none;  // the candidate last run as the best
  std::uint32_t stale_after_ = 0;   // the settings' stale_after, as of the last choice
  std::uint32_t explore_every_ = 1; // the settings' explore_every, as of the last choice
  double max_slowdown_ = 2;         // the settings' max_slowdown, as of the last choice
  double close_ = 0.25;             // the settings' close, as of the last choice
  double duel_from_ = 0;            // the challenger's fastest step before its duel
  bool duel_on_inherited_ = false;  // and whether that was an inherited one
};

}  // namespace dos
