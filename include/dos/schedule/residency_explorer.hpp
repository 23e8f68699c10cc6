#pragma once
/// @file
/// @brief `ResidencyExplorer`: chooses how many subgroups stay resident on the device
///        from steps that ran each count side by side, and the stride over the other
///        subgroups with a `StrideExplorer` per count. The model's count runs first;
///        fewer residents, down to none, must beat it in duels to take its place
///        (docs/design.md, "Choosing the residency").

#include "dos/schedule/explorer.hpp"
#include "dos/schedule/plan.hpp"
#include "dos/schedule/policy.hpp"
#include "dos/schedule/timeline.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace dos {

/// @brief The resident counts r*, r*/2, r*/4 and 0 (r*: the count the policy's model
///        chose when it was set), then the fixed share's count and counts between the
///        winner and its neighbours, compared side by side in duels of paired steps,
///        with the residents moved between the steps.
///
/// **The search.** First r* runs alone until its `StrideExplorer` has swept the strides
/// (`StrideExplorer::swept`): the sweep is the costly part of settling (strides the
/// model thought good may run 2x slow), and done once, early, it is not repeated for
/// each count. Then the first duel is r* (the incumbent) against no residents (what the
/// policy must never be slower than); then r*/2 and r*/4 challenge the winner so far in
/// turn. A challenger that loses to a larger count ends the search (going down from
/// there made the step slower); one that loses to no residents does not (the best
/// count may lie between). Each count runs at its best stride (measured or inherited),
/// or at the incumbent's while it has none, so that a duel compares residents alone;
/// but no residents without strides of its own streams nothing (it is then the all-CPU
/// update). A count that wins its place with no strides of its own takes those of the
/// count it beat, scaled by the duel's ratio (`StrideExplorer::inherit`), plays off
/// all-CPU and those that look faster than the one it runs, and re-checks them as they
/// go stale. No residents takes them too, its duel steps kept for k = 0 (the stride it
/// ran) and lining up the scale there. Smaller counts than
/// r*/4 are not compared: on 16 subgroups each would move the step by a few percent at
/// most, within what a duel on a shared machine can tell apart.
///
/// **The refinement.** The step's time need not fall or rise steadily with the count:
/// on the Zen 5 VM at link 0.6, 4 residents of 16 ran 16% faster than the model's 6 and
/// than 3 and none, the emulated device's Adam sharing the CPU's memory bandwidth. So
/// after those duels, if some residents won, up to `max_refinements` more challenge the
/// winner: first the fixed share's count (`StaticFraction`'s, passed to `choose`) if no
/// duel has compared it (r*/4 too, left out when the search ended early), wherever it
/// lies below r*: the plan a user would otherwise
/// pick is a candidate, as all-CPU is one for the strides; then a count between
/// the winner and its neighbour on the side with the wider gap (fewer residents on a
/// tie), until both gaps are one: halfway down (rounded down), a third of the way up
/// (at least one). Both lean towards fewer residents, which hold less device memory and
/// move less state. Counts above r* are not tried (the model predicted them slower, or
/// they do not fit), nor, when none won, any other count (below r*/4 as in the search;
/// the fixed share's neither, as every count compared lost to none).
///
/// **A duel** is `DuelScore::length` pairs of steps in the order incumbent,
/// challenger, challenger, incumbent, incumbent, ... so that the residents move once
/// per pair. The verdict is `StrideExplorer`'s: the challenger wins by more than 1%
/// both by its two fastest steps and by the median of the pairs' ratios (in a
/// re-check, below, or after a split verdict, then again over `DuelScore::confirm`
/// pairs), or at once by a
/// clear win; it loses at once by a clear loss (after three pairs, each of its steps
/// slower than each of the incumbent's by the margin), if in two pairs its step ran
/// more than `max_slowdown` times slower than the incumbent's paired one, or if a step
/// measured no time.
///
/// **The return matches.** When the search ends, the count that came closest to the
/// winner (the smallest median ratio over the winner's in the duel it lost, whether it
/// lost its place or failed to take it), if within `rematch_within`, meets the winner
/// again, once, `explore_every` steps later; then the winner's neighbour above (the
/// nearest compared count with more residents), if it lost its last duel (to the
/// winner or another count) by less than `close` and is not that count, meets the
/// winner at once after (if the first match changed the winner, only if it is still
/// above it), or first, `explore_every` steps later, where no count came close enough;
/// last (or first, where neither qualifies), the fixed share's count, if it is neither
/// of those, is not the winner, and ran within `rematch_within` of the winner by the
/// duels that lead from it to the winner (it lost to a count that lost to the winner,
/// say: the ratios multiply; checked again when its turn comes, after the other
/// matches): a duel of pairs is no final verdict on the plan the policy must not be
/// slower than. A count re-checked in the meantime has had its second look, and
/// loses its match.
/// All are fought in *blocks*: the winner's two steps, the
/// challenger's six, the winner's four, the two steps after each move not compared,
/// so that four of each side's steps compare as the two counts run when they stay (a
/// duel moves the residents every two steps, and the steps after a move read part of
/// the way towards the count left: docs/design.md, "What a duel of counts sees"). The
/// four pairs are judged as a duel's; a win must be confirmed by a second block, since
/// a block is long enough for a phase of the machine to begin and end within it. The
/// second confirms if its own four pairs do not read the challenger slower by the
/// margin and the eight pairs of both blocks read it faster, as a duel's confirming
/// pairs are judged with its first four (docs/design.md, "The second block").
///
/// **Settled**, the winning count's `StrideExplorer` chooses the stride. Every count
/// that lost is re-checked (a machine changes): `stale_after` steps after its loss,
/// later in proportion to how much slower it ran beyond `close` (as a stale stride is
/// re-checked), and twice as late after each re-check it loses, up to 16 times; the
/// most overdue first, and at once a count whose fastest step in its last duel beat
/// the running count's fastest recent step by more than `max_slowdown` times; by more
/// than `close / 2` (the running count's steps rose and stayed up), sooner than due,
/// at most once per wait that doubles with each such re-check lost (the second, for
/// the count that holds the return match, is that match, fought then). If a re-check
/// wins, the counts below it challenge it in turn, as in the search. Return matches
/// and re-checks wait until the running count's strides are swept, so that each count
/// is met at its best stride, not at the model's guess.
///
/// The residency asked for after a step is `next_residency`; the engine moves the
/// residents before the next step. Where a move asked for did not happen (it failed),
/// the explorer stops comparing and keeps the count in force, with its strides; where
/// the residency changed from outside (a used policy set anew), it starts afresh from
/// that count.
class ResidencyExplorer {
 public:
  static constexpr std::size_t max_refinements = 2;  ///< counts between tried after the search
  static constexpr std::size_t max_levels = 4 + max_refinements;  ///< r*, r*/2, r*/4, 0, then those
  /// A count that lost its duel by more than this fraction (median of the pairs'
  /// ratios) gets no return match as the closest: a few slow steps of a shared machine
  /// move a median of four pairs by less (on the Zen 5 VM about one step in five ran
  /// 1.2-1.4x slow), and on the scripted machine where the model is right a block for a
  /// count 22% slower would only cost its steps. (The winner's neighbour above gets one
  /// within `close`: see the class comment.)
  static constexpr double rematch_within = 0.1;

  /// @brief Room for every count's stride records, so that choosing never allocates.
  void reserve(std::size_t subgroups, std::uint32_t max_stride) {
    for (StrideExplorer& e : explorers_) e.reserve(detail::candidates(max_stride, subgroups));
  }

  /// @brief Builds this step's plan over the residency in force; returns its predicted
  ///        seconds. `plan.explored` marks a challenger's step in a duel, or a stride
  ///        explored. @p fixed_count: the count a fixed-share policy keeps resident
  ///        (`StaticFraction`'s), which the refinement tries first if no duel has
  ///        compared it, and which has a return match if it lost narrowly (see the
  ///        class comment); 0 or `none` leaves it out.
  template <class Request>
  double choose(const Request& r, std::uint32_t max_stride, Plan& plan, Plan& scratch, const ExploreSettings& s,
                std::size_t fixed_count = none) {
    const auto count = static_cast<std::size_t>(std::count(r.residency.begin(), r.residency.end(), Place::resident));
    settings_ = s;
    max_stride_ = max_stride;
    fixed_count_ = fixed_count;
    if (levels_ == 0) start(count, r.residency.size());
    else if (count == level_[want_]) {
      if (want_ != in_force_) moved_at_ = clock_;
      in_force_ = want_;
    }
    else if (want_ != in_force_) adopt(count);  // the move asked for did not happen
    else restart(count, r.residency.size());    // moved from outside: the policy set anew
    // The search begins once r*'s strides are swept, so that every count is compared at
    // the stride r* measured best and the winner need not sweep again.
    if (sweeping_ && explorers_[in_force_].swept()) {
      sweeping_ = false;
      start_duel(order_[next_++], Duel::search);
    }
    // Once the search is over, between the strides' own duels and not before the
    // running count's strides are swept (a count is met at its best stride, not at
    // the model's guess: no residents, the search's winner at all-CPU, lost its return
    // match at the model's k = 8, 20% slower, before its sweep had run k = 0): a return
    // match first, then a count the running one fell far behind, then the most overdue
    // re-check.
    if (!dueling_ && !searching_ && !explorers_[in_force_].dueling() && explorers_[in_force_].swept()) {
      if (rematch_ != none && clock_ >= rematch_at_ && clock_ - moved_at_ >= 2) {
        start_duel(std::exchange(rematch_, none), Duel::return_match);
      } else if (const std::size_t ahead = ahead_of_running(settings_.max_slowdown); ahead != none) {
        start_duel(ahead, Duel::recheck);  // the machine changed: pairs, which can end in three
      } else if (const std::size_t risen = clock_ >= rise_at_ ? ahead_of_running(1 + settings_.close / 2) : none; risen != none) {
        recheck(risen);
        risen_ = dueling_;
      } else {
        std::size_t due = none;
        for (std::size_t l = 0; l < levels_; ++l)
          if (l != incumbent_ && recheck_at_[l] >= 0 && clock_ >= recheck_at_[l] &&
              (due == none || recheck_at_[l] < recheck_at_[due]))
            due = l;
        if (due != none) start_duel(due, Duel::recheck);
      }
    }
    if (!dueling_) {
      StrideExplorer& e = explorers_[in_force_];
      const std::int64_t before = e.settled_after();
      const double t = e.choose(r, r.residency, max_stride, plan, scratch, s);
      if (e.settled_after() != before) settled_after_ = clock_ + 1;  // it explored while settling
      return t;
    }
    // A step of the duel: the count at its best stride (measured or inherited), or the
    // one it borrows while it has none.
    const std::uint32_t k = explorers_[in_force_].running().value_or(borrowed_stride(in_force_).value_or(0));
    double t = detail::stride_plan(r, r.residency, plan, k);
    if (!plan.fallback.empty()) {  // that stride no longer fits the staging budget
      const std::string_view reason = plan.fallback;
      t = detail::stride_plan(r, r.residency, plan, 0);
      plan.fallback = reason;
    }
    plan.explored = in_force_ != incumbent_;
    return t;
  }

  /// @brief Records the measured time of a step that ran the plan chosen last.
  void observe(const StepTimeline& t) {
    ++clock_;
    if (levels_ == 0) return;  // nothing chosen yet
    if (!dueling_) {
      StrideExplorer& e = explorers_[in_force_];
      const std::int64_t before = e.settled_after();
      e.observe(t);
      if (e.settled_after() != before) settled_after_ = clock_;  // a duel of strides won
      return;
    }
    const std::size_t side = in_force_ == incumbent_ ? 0 : 1;
    // The incumbent's steps ran its running stride, not to explore: they are its
    // explorer's measurements too, so that its estimate stays current.
    if (side == 0) explorers_[incumbent_].observe(t, /*chosen=*/false);
    if (kind_ == Duel::return_match) return observe_block(t.measured_seconds > 0 ? t.measured_seconds : inf);
    pair_[side] = t.measured_seconds > 0 ? t.measured_seconds : inf;
    fastest_[in_force_] = std::min(fastest_[in_force_], pair_[side]);
    if (++steps_in_pair_ < 2) {  // the pair's other side next
      want_ = side == 0 ? challenger_ : incumbent_;
      return;
    }
    steps_in_pair_ = 0;  // the next pair begins with the side that ran last
    // A step that measured nothing is no evidence: the incumbent stays.
    if (!std::isfinite(pair_[0]) || !std::isfinite(pair_[1])) return end_duel(false);
    bool won = false;
    const bool over = score_.add(pair_[0], pair_[1], won);
    // Out of reach in two pairs, not one: the first pair's challenger step is the first
    // after a move, where the moved subgroups' memory may still be cold (on the Zen 5
    // VM no residents once lost its opening after one pair and never ran again);
    // the second pair's order puts the incumbent's step after the move instead.
    out_of_reach_pairs_ += pair_[1] <= settings_.max_slowdown * pair_[0] ? 0 : 1;
    const bool out_of_reach = out_of_reach_pairs_ >= 2;
    const bool lost = score_.pairs == detail::DuelScore::clear && score_.clear_loss();
    if (over || out_of_reach || lost) end_duel(won && !out_of_reach && !lost);
  }

  /// @brief The residency wanted from the next step, into @p out, if it is not the one
  ///        in force.
  bool next_residency(std::vector<Place>& out) const {
    if (levels_ == 0 || want_ == in_force_) return false;
    resident_prefix(out, subgroups_, level_[want_]);
    return true;
  }

  /// @brief The counts compared: r*, r*/2, r*/4, 0 (those distinct), then the counts
  ///        between tried in the refinement, in the order tried.
  std::span<const std::size_t> levels() const noexcept { return {level_.data(), levels_}; }
  /// @brief The count in force: a challenger's, during its steps of a duel.
  std::size_t residents() const noexcept { return levels_ == 0 ? 0 : level_[in_force_]; }
  /// @brief The count chosen: the one that runs when no count is being compared.
  std::size_t chosen() const noexcept { return levels_ == 0 ? 0 : level_[incumbent_]; }
  /// @brief Whether the counts are still being compared for the first time (or again,
  ///        after a re-check found the machine changed), or wait for r*'s strides to be
  ///        swept before they are.
  bool searching() const noexcept { return searching_; }
  /// @brief The explorer of the strides over the count in force.
  const StrideExplorer& strides() const noexcept { return explorers_[in_force_]; }
  /// @brief Steps observed so far.
  std::int64_t steps() const noexcept { return clock_; }
  /// @brief The step after the last one that changed the count, ended a search, or
  ///        settled the strides (an exploring step of the sweep, or a duel won; see
  ///        `StrideExplorer::settled_after`).
  std::int64_t settled_after() const noexcept { return settled_after_; }

 private:
  static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  static constexpr double inf = std::numeric_limits<double>::infinity();
  enum class Duel { search, return_match, recheck };
  // Strides lent: whose, and the stride the borrower runs in its duel.
  struct Loan {
    std::size_t from = none;
    std::uint32_t stride = 0;
  };

  template <class T>
  static constexpr std::array<T, max_levels> filled(T value) noexcept {
    std::array<T, max_levels> a{};
    a.fill(value);
    return a;
  }

  void start(std::size_t count, std::size_t subgroups) {
    subgroups_ = subgroups;
    levels_ = 0;
    refined_ = 0;
    for (const std::size_t c : {count, count / 2, count / 4, std::size_t{0}})
      if (levels_ == 0 || c < level_[levels_ - 1]) level_[levels_++] = c;
    in_force_ = want_ = incumbent_ = 0;
    // The opening, r* against none; then the counts between, r*/2 first.
    const std::size_t last = levels_ - 1;
    order_size_ = next_ = 0;
    if (last > 0) order_[order_size_++] = last;
    for (std::size_t l = 1; l < last; ++l) order_[order_size_++] = l;
    searching_ = sweeping_ = order_size_ > 0;
  }

  // Everything measured is forgotten (the room reserved for it kept), but for the
  // strides of the first @p keep levels.
  void forget(std::size_t keep = 0) {
    for (std::size_t l = keep; l < explorers_.size(); ++l) explorers_[l].forget();
    recheck_at_.fill(-1);
    wait_.fill(0);
    fastest_.fill(inf);
    lost_to_.fill(none);
    lost_by_.fill(inf);
    rise_at_ = rise_wait_ = 0;
    rematch_ = rematch_next_ = rematch_fixed_ = none;
    searching_ = dueling_ = sweeping_ = false;
  }

  // What is in force is not a count of the search: it is the only one from now on.
  // Its strides are kept if it is the count in force (a move failed): on a failed
  // first move they are r*'s whole sweep.
  void adopt(std::size_t count) {
    const bool same = count == level_[in_force_];
    if (same) std::swap(explorers_[0], explorers_[in_force_]);  // swaps the room reserved too
    forget(same ? 1 : 0);
    level_[0] = count;
    levels_ = 1;
    in_force_ = want_ = incumbent_ = 0;
  }

  void restart(std::size_t count, std::size_t subgroups) {
    forget();
    start(count, subgroups);
  }

  // A count whose fastest step in its last duel beat the running count's fastest
  // recent step by more than @p factor times, the fastest such; none if there is none.
  // Two uses. By `max_slowdown` times (the machine changed: another job took the
  // device), it challenges at once, whatever its wait. By `close / 2` (the running
  // count's steps rose and stayed up for the five steps its fastest is taken over), it
  // challenges as a re-check, at most once per `rise_at_` wait: on the Zen 5 VM (run Y,
  // link 2) 4 residents won their place rightly at 0.75-0.90x all-CPU's time, and from
  // step 82 ran 1.2-1.3x, while no residents, which they had beaten, was due for its
  // re-check 200 steps after its loss. A duel refreshes the challenger's fastest step,
  // so a phase of the machine that slows every plan sets off each count's re-check once
  // at most (its fastest is then the phase's), and the counts that lost by more than
  // the rise are not re-checked at all.
  // Fastest against fastest, not against the running count's median: on the Zen 5 VM
  // a phase of steps 1.5-3x slow raised that median past twice what counts measured
  // before it, and two re-checks in twenty steps set off a new search late in a run,
  // whereas a step is slowed, hardly ever sped up, by the machine's other work.
  std::size_t ahead_of_running(double factor) const {
    const StrideExplorer& e = explorers_[in_force_];
    const std::optional<std::uint32_t> k = e.running();
    if (!k) return none;
    const double running = e.records()[*k].fastest();
    if (!std::isfinite(running)) return none;  // nothing measured since its last duel
    std::size_t ahead = none;
    for (std::size_t l = 0; l < levels_; ++l)
      if (l != in_force_ && running > factor * fastest_[l] && (ahead == none || fastest_[l] < fastest_[ahead]))
        ahead = l;
    return ahead;
  }

  // Whose strides count l takes if it wins a duel while it has none of its own, and
  // the stride l runs meanwhile: the incumbent's, at its running stride, so that both
  // sides differ in the residents alone; but no residents streams nothing (the all-CPU
  // update, what the policy must never be slower than). None while the incumbent has
  // no strides either.
  std::optional<Loan> lender(std::size_t l) const {
    const std::optional<std::uint32_t> k = explorers_[incumbent_].running();
    if (!k) return std::nullopt;
    return Loan{incumbent_, level_[l] == 0 ? 0u : *k};
  }

  std::optional<std::uint32_t> borrowed_stride(std::size_t l) const {
    const std::optional<Loan> loan = lender(l);
    return loan ? std::optional<std::uint32_t>{loan->stride} : std::nullopt;
  }

  // A re-check of count l, set off by the running count's rise. If l holds the return
  // match, that match is fought now, in blocks, once the residents have stayed two
  // steps, and as a return match (a win does not send the counts below after it): one
  // second look, not a duel of pairs and a block for the same count after
  // it (on the Xeon VM, run AH, 16M parameters, links 0.6 and 1, the running 4
  // residents' steps rose right after the search, and 3 residents had a re-check of two
  // and of four pairs, then its return match: 10 and 14 of the last 60 steps explored).
  void recheck(std::size_t l) {
    if (l != rematch_) return start_duel(l, Duel::recheck);
    if (clock_ - moved_at_ >= 2) start_duel(std::exchange(rematch_, none), Duel::return_match);
  }

  // The incumbent runs first: the duel begins where the residents are.
  void start_duel(std::size_t challenger, Duel kind) {
    fastest_[incumbent_] = fastest_[challenger] = inf;  // what this duel measures replaces it
    challenger_ = challenger;
    kind_ = kind;
    dueling_ = true;
    steps_in_pair_ = 0;
    block_step_ = 0;
    block_confirming_ = false;
    out_of_reach_pairs_ = 0;
    risen_ = false;
    score_.restart(kind == Duel::recheck);  // a settled count is replaced on firmer evidence
  }

  // A return match in blocks (see the class comment): the incumbent's two steps, the
  // challenger's six (the first two after the move not compared), the incumbent's four
  // (the same). Pairs: its steps 0, 1, 10, 11 against the challenger's 4-7.
  static constexpr int block_length = 12;
  void observe_block(double x) {
    const int i = block_step_++;
    if (i <= 1) block_[0][static_cast<std::size_t>(i)] = x;
    else if (i >= 4 && i <= 7) block_[1][static_cast<std::size_t>(i - 4)] = x;
    else if (i >= 10) block_[0][static_cast<std::size_t>(i - 8)] = x;
    if (i >= 2 && i <= 7) fastest_[challenger_] = std::min(fastest_[challenger_], x);
    else fastest_[incumbent_] = std::min(fastest_[incumbent_], x);
    const int next = i + 1;
    want_ = next >= 2 && next <= 7 ? challenger_ : incumbent_;
    // Far out of reach after its first two steps (pulled towards the incumbent's, if at
    // all): back at once.
    if (i == 3 && fastest_[challenger_] > settings_.max_slowdown * std::max(block_[0][0], block_[0][1])) {
      // One pair, so that the loss is filed at the ratio it ran (never the closest).
      score_.restart();
      bool won = false;
      score_.add(std::max(block_[0][0], block_[0][1]), fastest_[challenger_], won);
      return end_duel(false);
    }
    if (next < block_length) return;
    score_.restart();
    bool won = false;
    if (block_confirming_) {
      // The second block confirms if it does not contradict the first (its own four
      // pairs do not read the challenger slower by the margin) and the eight pairs of
      // both read it faster by the margin, as a duel's confirming pairs do: a block
      // that alone falls short of the margin in a slow phase of the challenger's is
      // no loss, one that reads it slower by the margin is, filed at its own ratio.
      for (std::size_t p = 0; p < 4; ++p) score_.add(block_[0][p], block_[1][p], won);
      if (score_.median_ratio() > 1 + detail::DuelScore::margin) return end_duel(false);
      score_.restart();
      static_assert(detail::DuelScore::confirm >= 8, "the score holds both blocks' pairs");
      for (std::size_t p = 0; p < 8; ++p) {
        const auto& b = p < 4 ? first_block_ : block_;
        score_.times[0][p] = b[0][p % 4];
        score_.times[1][p] = b[1][p % 4];
      }
      score_.pairs = 8;
      return end_duel(score_.challenger_won());
    }
    for (std::size_t p = 0; p < 4; ++p)
      if (score_.add(block_[0][p], block_[1][p], won)) break;
    won = won && !score_.split;
    if (won) {  // a second block must confirm it
      first_block_ = block_;
      block_confirming_ = true;
      block_step_ = 0;
      return;
    }
    end_duel(won);
  }

  // Count l lost a duel by @p excess (its time over the winner's, less one): it is
  // re-checked later, the later the slower it ran and the more re-checks it lost.
  void schedule(std::size_t l, double excess, bool lost_recheck) {
    const auto stale = static_cast<std::int64_t>(settings_.stale_after);
    wait_[l] = lost_recheck ? std::min(2 * std::max(wait_[l], stale), 16 * stale) : stale;
    // A re-check costs its pairs' steps of the slower count: waiting in proportion to
    // how much slower it ran keeps that at `close / stale_after` of a step on average,
    // as for the strides. (Clamped: a `close` of almost 0 must not overflow the clock.)
    const double scale = settings_.close > 0 ? std::max(1.0, excess / settings_.close) : 1.0;
    const double wait = std::min(static_cast<double>(wait_[l]) * scale, 1e15);
    recheck_at_[l] = clock_ + static_cast<std::int64_t>(std::ceil(wait));
  }

  void end_duel(bool won) {
    dueling_ = false;
    const std::size_t c = challenger_;
    const std::size_t loser = won ? incumbent_ : c;
    // How much slower the loser ran, side by side (0 if no pair was complete).
    const double ratio = score_.pairs > 0 ? score_.median_ratio() : 1;
    lost_to_[loser] = won ? c : incumbent_;
    lost_by_[loser] = won ? 1 / ratio : ratio;
    schedule(loser, std::max(0.0, won ? 1 / ratio - 1 : ratio - 1), kind_ == Duel::recheck && !won);
    const bool slower_going_down = !won && level_[c] < level_[incumbent_] && level_[c] != 0;
    if (won) {
      // One duel on a shared machine can be lost to a few slow steps: the count that
      // lost its place is not challenged again in this search, and its return match is
      // due `explore_every` steps from now (unless it just won its place back); when
      // the search ends, the count that came closest gets it (below).
      if (kind_ != Duel::return_match) rematch_ = incumbent_, rematch_at_ = clock_ + settings_.explore_every;
      recheck_at_[c] = -1;
      // A count with no strides of its own (nor inherited) ran a borrowed stride in the
      // duel: it takes the strides of their lender, scaled by how it ran against the
      // incumbent, rather than sweeping them again, and keeps its duel steps for the
      // stride it ran. No residents too, which ran all-CPU: its steps line up the
      // scale on k = 0 (`StrideExplorer::inherit`), which says nothing of streaming,
      // so the strides near k = 0 are played off as after a sweep. A sweep of its own
      // would fall after r*'s and the opening, at steps 35-60 of a 120-step run, and
      // measure all-CPU once more, in one step that may be a slow one (docs/design.md,
      // "No residents takes the strides too").
      if (!explorers_[c].running())
        if (const std::optional<Loan> loan = lender(c))
          // (Its steps are filed under the stride its own subgroups streamed: with
          // fewer streamable than the lender's stride, the last.)
          explorers_[c].inherit(explorers_[loan->from], ratio,
                                std::min(loan->stride, detail::candidates(max_stride_, subgroups_ - level_[c])),
                                {score_.times[1].data(), score_.pairs}, level_[c] == 0);
      incumbent_ = c;
      settled_after_ = clock_;
    }
    want_ = incumbent_;
    if (kind_ == Duel::return_match) {
      // The neighbour above meets the winner next, at once: waiting would not make its
      // block cheaper, only later. If the first match changed the winner, only if it is
      // still above it (a count that lost its place to one below it is no neighbour of
      // the new winner from above, and its loss was not to it).
      // The fixed share's count then, if it lost and is not the winner now.
      next_rematch();
    } else if (kind_ == Duel::recheck) {
      // A count re-checked in pairs has had its second look: no block for it after.
      if (rematch_next_ == c) rematch_next_ = none;
      if (rematch_fixed_ == c) rematch_fixed_ = none;
      if (rematch_ == c) next_rematch();
    }
    if (risen_) {
      // A re-check set off by the running count's rise that it loses makes the next one
      // wait, twice as long after each, from `explore_every` up to `stale_after` steps:
      // a machine whose every plan slows and speeds up in turn must not duel on each
      // slow phase.
      rise_wait_ = won ? 0 : detail::doubled_wait(rise_wait_, settings_.explore_every, settings_.stale_after);
      rise_at_ = clock_ + rise_wait_;
    }
    if (kind_ == Duel::recheck && won) {
      // The machine changed: the counts below the new one challenge it in turn, the
      // largest first (the one it beat excepted, which has its return match), then
      // the refinement again.
      searching_ = true;
      order_size_ = next_ = refined_ = 0;
      for (std::size_t l = 0; l < levels_; ++l)
        if (level_[l] < level_[c]) {
          std::size_t i = order_size_++;
          for (; i > 0 && level_[order_[i - 1]] < level_[l]; --i) order_[i] = order_[i - 1];
          order_[i] = l;
        }
    }
    if (!searching_) return;
    // The search goes on unless going down from a larger count made the step slower.
    if (slower_going_down) next_ = order_size_;
    while (next_ < order_size_)
      if (const std::size_t l = order_[next_++]; l != incumbent_ && l != rematch_) return start_duel(l, Duel::search);
    if (const std::size_t l = refinement(); l != none) return start_duel(l, Duel::search);
    searching_ = false;
    settled_after_ = clock_;
    // The return match goes to the count that came closest to the winner, if it lost
    // by less than `rematch_within`: on the Zen 5 VM at 64M parameters and link 2
    // (2026-12-04) 16 residents, which ran 6-9% faster than 12 when either stayed, lost
    // its duel to 12 in two runs of five and won one it lost back in its return match;
    // a count that lost its place may not be the one the duels misjudged. Then the
    // winner's neighbour above (the nearest compared count with more residents) meets
    // it too, if it lost its last duel, to the winner or another, by less than `close`:
    // on the same VM at 16M parameters and links 1 and 2, where static_fraction's 4
    // residents ran 6-15% faster than 3, 4 lost its duel to 3 by 20% (its steps in a
    // phase of the machine 1.3x slow) while 2 came closest and had the one return
    // match there was; and once 4 lost to 2, which 3 then beat. In each, the count
    // misjudged was above the winner. (Giving the neighbour below a return match too
    // made the scripted `zen5_none_first` end on 0 or 1 residents in 296 of 2000 runs
    // instead of 178: blocks cost steps and misjudge too.)
    // (A count not yet compared has lost no duel: lost_to_ none. Written as !(x <= y) so
    // that a ratio of two steps that measured nothing, NaN, qualifies for nothing.)
    // Last, the fixed share's count, if neither of those is it and it ran within
    // `rematch_within` of the winner (by the ratios of the duels that lead from it to
    // the winner, each lost to the next): a duel of pairs is no final verdict on the
    // plan the policy must not be slower than (in run AI, 16M parameters, five runs of
    // twelve ran 2, 3 or 5 residents, 1.08-1.15x `static_fraction`'s time, after pairs
    // had ranked them over its 4). Not within `close`, as the neighbour above: a block
    // costs six steps of the challenger, which at 24% slower (the scripted machine whose
    // residents slow the step from step 100) cost the late half 1%.
    std::size_t closest = none, above = none, fixed = none;
    for (std::size_t l = 0; l < levels_; ++l) {
      if (l == incumbent_ || lost_to_[l] == none) continue;
      if (lost_to_[l] == incumbent_ && (closest == none || lost_by_[l] < lost_by_[closest])) closest = l;
      if (level_[l] > level_[incumbent_] && (above == none || level_[l] < level_[above])) above = l;
      if (fixed_count_ > 0 && level_[l] == fixed_count_) fixed = l;
    }
    if (closest != none && !(lost_by_[closest] <= 1 + rematch_within)) closest = none;
    if (above != none && (above == closest || !(lost_by_[above] <= 1 + settings_.close))) above = none;
    if (fixed != none && (fixed == closest || fixed == above || !(behind(fixed) <= 1 + rematch_within))) fixed = none;
    if (closest == none) std::swap(closest, above);
    if (closest == none) std::swap(closest, fixed);
    rematch_next_ = above;
    rematch_fixed_ = fixed;
    if (closest == none) {
      rematch_ = none;
      return;
    }
    if (rematch_ == none) rematch_at_ = clock_ + settings_.explore_every;
    rematch_ = closest;
  }

  // The return match queued after the one over (see end_duel), due now.
  void next_rematch() {
    rematch_ = std::exchange(rematch_next_, none);
    if (rematch_ != none && level_[rematch_] <= level_[incumbent_]) rematch_ = none;
    if (rematch_ == none) {
      rematch_ = std::exchange(rematch_fixed_, none);
      // What the matches before it measured counts: it may have fallen further behind.
      if (rematch_ != none && !(behind(rematch_) <= 1 + rematch_within)) rematch_ = none;
    }
    if (rematch_ == incumbent_) rematch_ = none;
    rematch_at_ = clock_;
  }

  // How much slower count l ran than the incumbent: the product of the median ratios
  // of the duels from l to the incumbent, each lost to the next; infinite where the
  // losses lead elsewhere (or round in a circle).
  double behind(std::size_t l) const {
    double ratio = 1;
    for (std::size_t hops = 0; hops < levels_ && l != incumbent_; ++hops) {
      if (lost_to_[l] == none) return inf;
      ratio *= lost_by_[l];
      l = lost_to_[l];
    }
    return l == incumbent_ ? ratio : inf;
  }

  // The next count of the refinement (see the class comment), added to the levels;
  // none when the winner's gaps are one or the refinements are spent.
  std::size_t refinement() {
    if (refined_ == max_refinements || levels_ == max_levels) return none;
    const std::size_t c = level_[incumbent_];
    // None won: every count compared lost to none, the fixed share's too if it was
    // among them; a first version that tried it there too made the scripted
    // `zen5_device_phases` (no residents the best, residents cheaper in phases) end
    // over all-CPU by 2% in 1204 runs of 2000 (120 steps), against 966 without, a phase
    // falling on its duel.
    if (c == 0) return none;
    // The fixed share's count first, wherever it lies below r*, if no duel has compared
    // it: a plan a user would otherwise pick is a candidate, as all-CPU is one for the
    // strides. On the Xeon VM at 64M parameters (run AH, 2026-12-06) the step's time
    // was sharp around `static_fraction`'s 16 residents of 64, and the halving search,
    // from the model's 17-32, ended on 13-19, each 2-7% slower than 16; in run AI it
    // reached 16 in ten runs of twelve, and in the other two a duel of pairs had ranked
    // 7 over 15, so that 16 lay past the winner's neighbour and was never tried.
    // (Counts above r* are not: they may not fit.)
    if (fixed_count_ > 0 && fixed_count_ < level_[0]) {
      const std::size_t l = level_of(fixed_count_);
      if (l == none) return add_level(fixed_count_);
      // r*/4, say, left out when r*/2 lost to r* and ended the search.
      if (l != incumbent_ && lost_to_[l] == none) return ++refined_, l;
    }
    std::size_t below = c, above = c;  // the nearest compared counts each side; c: none
    for (std::size_t l = 0; l < levels_; ++l) {
      if (level_[l] < c && (below == c || level_[l] > below)) below = level_[l];
      if (level_[l] > c && (above == c || level_[l] < above)) above = level_[l];
    }
    const std::size_t gap_below = c - below, gap_above = above - c;
    if (std::max(gap_below, gap_above) <= 1) return none;
    // Both ways the count tried leans towards fewer residents: down, halfway
    // rounded down (from 6 with 3 below: 4, the best on the scripted Zen 5 machine);
    // up, a third of the way (on the Zen 5 VM at links 0.6 and 2, 2026-12-04, the
    // model's 7 lost to none and 3 won in five runs of six; halfway then tried 5 and 2
    // and never 4, which ran 8% faster than 3).
    // (`above` is c itself where none is compared above: then the count must be below c.)
    return add_level(gap_below >= gap_above ? below + gap_below / 2 : c + std::max<std::size_t>(1, gap_above / 3));
  }

  // The level of a resident count; none if it is not among them.
  std::size_t level_of(std::size_t count) const noexcept {
    for (std::size_t l = 0; l < levels_; ++l)
      if (level_[l] == count) return l;
    return none;
  }

  // A count of the refinement, added to the levels.
  std::size_t add_level(std::size_t count) {
    const std::size_t l = levels_++;
    level_[l] = count;
    recheck_at_[l] = -1;
    wait_[l] = 0;
    fastest_[l] = inf;
    lost_to_[l] = none;
    lost_by_[l] = inf;
    ++refined_;
    return l;
  }

  std::array<std::size_t, max_levels> level_{};         // resident counts: r*, r*/2, r*/4, 0, then the refinement's
  std::size_t levels_ = 0;                              // how many; 0 before the first choice
  std::size_t refined_ = 0;                             // refinement duels started in this search
  std::array<StrideExplorer, max_levels> explorers_{};  // per count: the strides over the others
  std::array<std::int64_t, max_levels> recheck_at_ = filled<std::int64_t>(-1);  // per count: its re-check; -1 none
  std::array<std::int64_t, max_levels> wait_{};         // per count: its wait, before scaling
  std::array<double, max_levels> fastest_ = filled(inf);  // per count: its fastest step in its last duel
  std::array<std::size_t, max_levels> lost_to_ = filled(none);  // per count: whom it lost its last duel to
  std::array<double, max_levels> lost_by_ = filled(inf);        // and its median ratio over the winner's
  std::size_t subgroups_ = 0;
  std::size_t fixed_count_ = none;  // the fixed share's count, as the last choice was asked
  std::size_t in_force_ = 0;   // the count the last choice saw
  std::size_t want_ = 0;       // the count asked for from the next step
  std::size_t incumbent_ = 0;  // the count that runs when nothing is compared
  std::size_t challenger_ = 0;
  Duel kind_ = Duel::search;
  bool searching_ = false;
  bool dueling_ = false;
  bool sweeping_ = false;  // the search waits for r*'s first sweep of the strides
  std::array<std::size_t, max_levels> order_{};  // the search's challengers, in turn
  std::size_t order_size_ = 0;
  std::size_t next_ = 0;           // the next of them
  std::size_t rematch_ = none;     // the count that meets the winner again (the search skips it)
  std::size_t rematch_next_ = none;  // the winner's neighbour above, which meets it after
  std::size_t rematch_fixed_ = none;  // the fixed share's count, which meets it last
  std::int64_t rematch_at_ = 0;
  std::uint32_t steps_in_pair_ = 0;
  int block_step_ = 0;                        // steps of a return match so far
  bool block_confirming_ = false;             // its first block won: a second confirms
  std::array<std::array<double, 4>, 2> block_{};  // its compared steps: incumbent's, challenger's
  std::array<std::array<double, 4>, 2> first_block_{};  // the first block's, while a second confirms it
  std::int64_t moved_at_ = -1000;             // the step the count last changed
  bool risen_ = false;                        // this re-check was set off by the running count's rise
  std::int64_t rise_at_ = 0;                  // the first step another such may start
  std::int64_t rise_wait_ = 0;                // the wait after the last one, lost; 0 after one won
  std::uint32_t out_of_reach_pairs_ = 0;  // pairs of this duel the challenger ran out of reach
  std::array<double, 2> pair_{inf, inf};  // this pair's steps: incumbent, challenger
  detail::DuelScore score_;
  ExploreSettings settings_{};
  std::uint32_t max_stride_ = 0;  // as the last choice was asked
  std::int64_t clock_ = 0;
  std::int64_t settled_after_ = 0;
};

}  // namespace dos
