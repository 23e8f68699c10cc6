#pragma once
/// @file
/// @brief How dos reports bad input: `std::invalid_argument` whose message names the
///        field and the offending value. Every check runs before any state changes.

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace dos {

/// @brief Throws `std::invalid_argument` with a message formatted by {fmt}, prefixed
///        with "dos: " so that the origin is clear inside a framework's stack trace.
template <class... Args>
[[noreturn]] void throw_invalid_argument(fmt::format_string<Args...> format, Args&&... args) {
  throw std::invalid_argument("dos: " + fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dos
