#pragma once
/// @file
/// @brief `AnyPolicy`: holds any `AssignmentPolicy` by value (a built-in or a user's),
///        so `Options` and `set_policy` take every policy without a template parameter.
///        Copying clones; choosing is one virtual call per step and allocates nothing.

#include "dos/schedule/policies.hpp"
#include "dos/schedule/policy.hpp"
#include "dos/schedule/timeline.hpp"

#include <cstddef>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace dos {

/// @brief A type-erased assignment policy; `AutomaticStride` by default.
/// @code
/// dos::Options o;
/// o.interleave.policy = dos::FixedStride{.stride = 3};
/// opt.set_policy(dos::ResidentThenStride{});          // residents move between steps
/// if (const auto* k = opt.policy().target<dos::FixedStride>()) std::printf("k=%u\n", k->stride);
/// @endcode
class AnyPolicy {
 public:
  AnyPolicy() : AnyPolicy(AutomaticStride{}) {}
  // The exclusion comes first: checking AssignmentPolicy<AnyPolicy> would ask whether
  // AnyPolicy is copyable, which asks this constructor again.
  template <class P>
    requires(!std::is_same_v<std::remove_cvref_t<P>, AnyPolicy> && AssignmentPolicy<P>)
  AnyPolicy(P policy)  // NOLINT(google-explicit-constructor): a policy is an AnyPolicy
      : self_(std::make_unique<Model<P>>(std::move(policy))) {}
  AnyPolicy(const AnyPolicy& o) : self_(o.self_ ? o.self_->clone() : nullptr) {}
  AnyPolicy(AnyPolicy&&) noexcept = default;
  AnyPolicy& operator=(const AnyPolicy& o) {
    if (this != &o) self_ = o.self_ ? o.self_->clone() : nullptr;
    return *this;
  }
  AnyPolicy& operator=(AnyPolicy&&) noexcept = default;
  ~AnyPolicy() = default;

  std::string_view name() const { return self_->name(); }
  /// @throws std::invalid_argument for a bad setting of the held policy.
  void validate() const { self_->validate(); }
  void residency(const ResidencyRequest& r, std::vector<Place>& out) const { self_->residency(r, out); }
  double choose(const PlanRequest& r, Plan& plan) { return self_->choose(r, plan); }
  /// @brief Lets the held policy make room for @p subgroups, if it keeps per-step
  ///        records, so that choosing never allocates.
  void reserve(std::size_t subgroups) { self_->reserve(subgroups); }
  /// @brief Shows the held policy a step that ran, if it wants to see it.
  void observe(const StepTimeline& t) { self_->observe(t); }
  /// @brief The residency the held policy wants from the next step into @p out, if it
  ///        wants another than the one in force; false if not (or if it never moves
  ///        residents).
  bool next_residency(std::vector<Place>& out) { return self_->next_residency(out); }

  /// @brief The held policy if it is a `P`, else null.
  template <class P>
  const P* target() const noexcept {
    const auto* m = dynamic_cast<const Model<P>*>(self_.get());
    return m != nullptr ? &m->policy : nullptr;
  }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual std::unique_ptr<Concept> clone() const = 0;
    virtual std::string_view name() const = 0;
    virtual void validate() const = 0;
    virtual void residency(const ResidencyRequest& r, std::vector<Place>& out) const = 0;
    virtual double choose(const PlanRequest& r, Plan& plan) = 0;
    virtual void reserve(std::size_t subgroups) = 0;
    virtual void observe(const StepTimeline& t) = 0;
    virtual bool next_residency(std::vector<Place>& out) = 0;
  };
  template <class P>
  struct Model final : Concept {
    explicit Model(P p) : policy(std::move(p)) {}
    std::unique_ptr<Concept> clone() const override { return std::make_unique<Model>(policy); }
    std::string_view name() const override { return policy.name(); }
    void validate() const override { policy.validate(); }
    void residency(const ResidencyRequest& r, std::vector<Place>& out) const override { policy.residency(r, out); }
    double choose(const PlanRequest& r, Plan& plan) override { return policy.choose(r, plan); }
    void reserve(std::size_t subgroups) override {
      if constexpr (requires { policy.reserve(subgroups); }) policy.reserve(subgroups);
    }
    void observe(const StepTimeline& t) override {
      if constexpr (requires { policy.observe(t); }) policy.observe(t);
    }
    bool next_residency(std::vector<Place>& out) override {
      if constexpr (requires { policy.next_residency(out); }) return policy.next_residency(out);
      else return false;
    }
    P policy;
  };
  std::unique_ptr<Concept> self_;
};

}  // namespace dos
