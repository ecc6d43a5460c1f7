#pragma once
// One serializer for every value ranks exchange (World::all_gather,
// World::agree): trivially copyable values as their bytes, strings and
// vectors with a length, and structs field by field, each field named so a
// disagreement between ranks names the field:
//
//   struct ModelEntry {
//     std::string name;
//     std::vector<std::int64_t> shape;
//     bool trainable;
//     static constexpr auto wire_fields() {
//       return std::tuple{dtrain::field("name", &ModelEntry::name), dtrain::field("shape", &ModelEntry::shape),
//                         dtrain::field("trainable", &ModelEntry::trainable)};
//     }
//   };
//
// The encoding is for ranks of one job (same build, same machine kind): no
// versioning, native byte order.

#include <concepts>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"

namespace dtrain {

// A named member of a struct that travels between ranks.
template <class S, class M>
struct WireField {
  using pointer = M S::*;
  const char* name;
  pointer member;
};

template <class S, class M>
constexpr WireField<S, M> field(const char* name, M S::*member) {
  return {name, member};
}

namespace detail {
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
}  // namespace detail

// A struct that lists its fields (wire_fields(): a tuple of dtrain::field).
template <class T>
concept WireStruct = requires {
  T::wire_fields();
};

template <class T>
concept WireValue = WireStruct<T> || std::same_as<T, std::string> || detail::is_vector<T>::value ||
    (std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>);

namespace wire {

template <class T>
void put(std::string& out, const T& v) {
  if constexpr (WireStruct<T>) {
    std::apply([&](const auto&... f) { (put(out, v.*(f.member)), ...); }, T::wire_fields());
  } else if constexpr (std::same_as<T, std::string> || detail::is_vector<T>::value) {
    const auto n = static_cast<std::uint64_t>(v.size());
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    if constexpr (std::same_as<T, std::string>)
      out += v;
    else
      for (const auto& e : v) put(out, e);
  } else {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
}

// Reads what put wrote from the front of `in`, advancing it.
template <class T>
void get(std::string_view& in, T& v) {
  const auto need = [&](std::size_t n) {
    if (in.size() < n)
      throw comm_error("a message from another rank ended early (" + std::to_string(in.size()) + " bytes left, " +
                           std::to_string(n) + " wanted)",
                       "every rank must run the same build of the program");
  };
  const auto take = [&](void* dst, std::size_t n) {
    need(n);
    std::memcpy(dst, in.data(), n);
    in.remove_prefix(n);
  };
  if constexpr (WireStruct<T>) {
    std::apply([&](const auto&... f) { (get(in, v.*(f.member)), ...); }, T::wire_fields());
  } else if constexpr (std::same_as<T, std::string> || detail::is_vector<T>::value) {
    std::uint64_t n = 0;
    take(&n, sizeof n);
    if constexpr (std::same_as<T, std::string>) {
      need(static_cast<std::size_t>(n));
      v.assign(in.data(), n);
      in.remove_prefix(n);
    } else {
      // Every element takes a byte at least: a count beyond the bytes left
      // is a damaged or hostile message, not a reason to allocate it.
      if (n > in.size())
        throw comm_error("a message from another rank claims " + std::to_string(n) + " elements in " +
                             std::to_string(in.size()) + " bytes",
                         "every rank must run the same build of the program");
      v.resize(static_cast<std::size_t>(n));
      for (auto& e : v) get(in, e);
    }
  } else {
    take(&v, sizeof v);
  }
}

template <class T>
std::string encode(const T& v) {
  std::string out;
  put(out, v);
  return out;
}

template <class T>
T decode(std::string_view bytes) {
  T v{};
  get(bytes, v);
  if (!bytes.empty())
    throw comm_error("a message from another rank has " + std::to_string(bytes.size()) + " bytes too many",
                     "every rank must run the same build of the program");
  return v;
}

// A value as text, for messages.
template <class T>
std::string text(const T& v) {
  std::string s;
  if constexpr (WireStruct<T>) {
    s = "{";
    std::apply(
        [&](const auto&... f) {
          const auto one = [&](const auto& fld) {
            if (s.size() > 1) s += ", ";
            s += fld.name;
            s += ' ';
            s += text(v.*(fld.member));
          };
          (one(f), ...);
        },
        T::wire_fields());
    s += '}';
  } else if constexpr (std::same_as<T, std::string>) {
    s += '\'';
    s += v;
    s += '\'';
  } else if constexpr (detail::is_vector<T>::value) {
    s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) s += ", ";
      s += text(v[i]);
    }
    s += ']';
  } else if constexpr (std::same_as<T, bool>) {
    s = v ? "true" : "false";
  } else if constexpr (std::is_enum_v<T>) {
    s = std::to_string(static_cast<long long>(v));
  } else if constexpr (std::is_arithmetic_v<T>) {
    s = std::to_string(v);
  } else {
    s = "(" + std::to_string(sizeof(T)) + " bytes)";
  }
  return s;
}

// Where a and b first differ: the path of the field ("seed", "[3].shape") and
// both values as text; nullopt when they are equal.
struct Difference {
  std::string where, a, b;
};

template <class T>
std::optional<Difference> first_difference(const T& a, const T& b, const std::string& where = "") {
  const auto join = [&](std::string_view part, bool index) {
    std::string w = where;
    if (!w.empty() && !index) w += '.';
    w += part;
    return w;
  };
  if constexpr (WireStruct<T>) {
    std::optional<Difference> d;
    std::apply(
        [&](const auto&... f) {
          const auto one = [&](const auto& fld) {
            if (!d) d = first_difference(a.*(fld.member), b.*(fld.member), join(fld.name, false));
          };
          (one(f), ...);
        },
        T::wire_fields());
    return d;
  } else if constexpr (detail::is_vector<T>::value) {
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
      std::string index(1, '[');  // not "[" + ...: GCC 12 warns falsely of overlap (-Wrestrict) on that
      index += std::to_string(i);
      index += ']';
      if (auto d = first_difference(a[i], b[i], join(index, true))) return d;
    }
    if (a.size() != b.size())
      return Difference{where.empty() ? std::string("size") : where + " size", std::to_string(a.size()),
                        std::to_string(b.size())};
    return std::nullopt;
  } else if constexpr (std::equality_comparable<T>) {
    if (a == b) return std::nullopt;
    return Difference{where, text(a), text(b)};
  } else {
    if (std::memcmp(&a, &b, sizeof(T)) == 0) return std::nullopt;
    return Difference{where, text(a), text(b)};
  }
}

}  // namespace wire

}  // namespace dtrain
