#pragma once
// dtrain's version, written in this one place. CMakeLists.txt reads the three
// numbers below for project(VERSION) (and so for the installed
// dtrain-config-version.cmake), conanfile.py reads them for the Conan
// package, and tests/packaging checks that ports/dtrain/vcpkg.json and
// CHANGELOG.md name the same version. Keep each #define on one line: the
// build scripts match them with a regular expression.

#include <cstddef>
#include <string_view>

#define DTRAIN_VERSION_MAJOR 0
#define DTRAIN_VERSION_MINOR 1
#define DTRAIN_VERSION_PATCH 0

namespace dtrain {

inline constexpr int version_major = DTRAIN_VERSION_MAJOR;
inline constexpr int version_minor = DTRAIN_VERSION_MINOR;
inline constexpr int version_patch = DTRAIN_VERSION_PATCH;

namespace detail {

// "MAJOR.MINOR.PATCH" spelled out at compile time from the numbers, so the
// text can never disagree with them. Three ints of at most 10 digits, two
// dots and a terminating NUL fit in 33 chars.
struct version_text {
  char chars[33]{};
  std::size_t size = 0;

  constexpr void append(int n) {
    char digits[10]{};
    std::size_t k = 0;
    do {
      digits[k++] = static_cast<char>('0' + n % 10);
      n /= 10;
    } while (n != 0);
    while (k != 0) chars[size++] = digits[--k];
  }
};

constexpr version_text make_version_text() {
  version_text t;
  t.append(version_major);
  t.chars[t.size++] = '.';
  t.append(version_minor);
  t.chars[t.size++] = '.';
  t.append(version_patch);
  return t;
}

inline constexpr version_text version_text_v = make_version_text();

}  // namespace detail

// "0.1.0". version.data() is NUL-terminated, so it also works with printf("%s").
inline constexpr std::string_view version{detail::version_text_v.chars, detail::version_text_v.size};

}  // namespace dtrain
