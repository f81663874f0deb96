// One name table per enum: its printer, its parser and, for a choice
// parameter, its list of choices all read the same table, so a choice list
// can never drift from the parser behind it.
//
//   inline constexpr NameTable<DType, 5> kDTypeNames{{{
//       {DType::fp32, "fp32"}, {DType::tf32, "tf32"}, ...}}};
//   std::string_view to_string(DType t) { return kDTypeNames.name(t); }
//   std::optional<DType> parse_dtype(std::string_view s) { return kDTypeNames.parse(s); }
//   ParamSpec{.type = ParamType::choice, .choices = kDTypeNames.names()}
#pragma once

#include <array>        // std::array
#include <cstddef>      // std::size_t
#include <initializer_list>  // std::initializer_list
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::pair
#include <vector>       // std::vector

namespace sb {

template <class E, std::size_t N>
struct NameTable {
  std::array<std::pair<E, std::string_view>, N> entries;

  // "?" for a value outside the table (a cast from a bad integer).
  constexpr std::string_view name(E e) const {
    for (const auto& [v, n] : entries)
      if (v == e) return n;
    return "?";
  }
  constexpr std::optional<E> parse(std::string_view s) const {
    for (const auto& [v, n] : entries)
      if (n == s) return v;
    return std::nullopt;
  }
  // Every name, in table order: a choice parameter's choices.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [v, n] : entries) out.emplace_back(n);
    return out;
  }
  // The names of a subset (a scenario that takes some dtypes), in the
  // subset's order: still spelled by the table, so never a stray string.
  std::vector<std::string> names(std::initializer_list<E> subset) const {
    std::vector<std::string> out;
    for (E e : subset) out.emplace_back(name(e));
    return out;
  }
  // Every value, in table order.
  constexpr std::array<E, N> values() const {
    std::array<E, N> out{};
    for (std::size_t i = 0; i < N; ++i) out[i] = entries[i].first;
    return out;
  }
};

}  // namespace sb
