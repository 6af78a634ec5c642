// kiln/policies.hpp: resolves a pack of policies, given in any order, to one policy per axis.
//
//   kiln::policy_pack<kiln::optim::adamw, kiln::precision::fp32>::optimizer  == kiln::optim::adamw
//   kiln::policy_pack<kiln::optim::adamw>::sharding                          == kiln::sharding::single
//
// Axes not named take their default. Two policies on one axis, or a type that is not a policy,
// stop the build with a static_assert sentence naming the axis; the resolved types then fall
// back to the defaults so that the compiler reports that sentence and not a cascade after it.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kiln/concepts.hpp"
#include "kiln/accumulation/steps.hpp"
#include "kiln/checkpointing/none.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/precision/fp32.hpp"
#include "kiln/profiler/none.hpp"
#include "kiln/sharding/single.hpp"

namespace kiln {

// The default of each axis (kiln/axes.hpp's second column), used when a pack does not name one:
// kiln::defaults::precision is kiln::precision::fp32, and so on.
namespace defaults {
#define KILN_DETAIL_DEFAULT(axis_name, default_policy) using axis_name = default_policy;
KILN_AXES(KILN_DETAIL_DEFAULT)
#undef KILN_DETAIL_DEFAULT
}  // namespace defaults

namespace detail {

template <class Axis, class... Ps>
inline constexpr std::size_t count_on_axis = (std::size_t{0} + ... + (on_axis<Axis, Ps> ? 1 : 0));

template <class Axis, class Default, class... Ps>
struct select_on_axis {
  using type = Default;
};
template <class Axis, class Default, class P, class... Rest>
struct select_on_axis<Axis, Default, P, Rest...> {
  using type = std::conditional_t<on_axis<Axis, P>, P, typename select_on_axis<Axis, Default, Rest...>::type>;
};

template <class Axis, class Default, class... Ps>
using select_on_axis_t = typename select_on_axis<Axis, Default, Ps...>::type;

}  // namespace detail

template <class... Ps>
struct policy_pack {
 private:
  static constexpr bool each_is_a_policy = (true && ... && check_policy<Ps>());

#define KILN_DETAIL_AT_MOST_ONE(axis_name, default_policy) &&detail::count_on_axis<axis::axis_name, Ps...> <= 1
  static constexpr bool one_per_axis = true KILN_AXES(KILN_DETAIL_AT_MOST_ONE);
#undef KILN_DETAIL_AT_MOST_ONE

#define KILN_DETAIL_ASSERT_ONE(axis_name, default_policy)           \
  static_assert(detail::count_on_axis<axis::axis_name, Ps...> <= 1, \
                "kiln: two policies on the " #axis_name " axis: a pack takes at most one policy per axis");
  KILN_AXES(KILN_DETAIL_ASSERT_ONE)
#undef KILN_DETAIL_ASSERT_ONE

 public:
  // False when a static_assert above has fired; the types below are then the defaults.
  static constexpr bool valid = each_is_a_policy && one_per_axis;

  template <class Axis, class Default>
  using pick = std::conditional_t<valid, detail::select_on_axis_t<Axis, Default, Ps...>, Default>;

  // One member type per axis: policy_pack<...>::precision, ::optimizer, ...
#define KILN_DETAIL_PICK(axis_name, default_policy) using axis_name = pick<axis::axis_name, defaults::axis_name>;
  KILN_AXES(KILN_DETAIL_PICK)
#undef KILN_DETAIL_PICK
};

}  // namespace kiln
