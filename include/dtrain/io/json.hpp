#pragma once
// nlohmann/json for dtrain's own .ipp code (checkpoint indexes, safetensors
// headers, Hugging Face configs). Header-only, its templates are compiled
// at -O1 like that code (DTRAIN_IMPL_BEGIN, core/macros.hpp): they parse
// small files once per run. The standard headers it uses come first, outside
// that region, so that the rest of a user's program keeps its own level for
// them; a user who wants nlohmann/json at the build's level includes it
// before dtrain's headers. tests/io/impl_o1_check.cmake checks that no
// standard header is first opened inside the region.

#include "dtrain/core/macros.hpp"

#include <algorithm>
#include <any>
#include <array>
#include <cassert>
#include <cmath>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <forward_list>
#include <functional>
#include <initializer_list>
#include <iomanip>
#include <ios>
#include <iosfwd>
#include <istream>
#include <iterator>
#include <limits>
#include <locale>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <ranges>
#include <sstream>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <valarray>
#include <vector>
#include <version>

DTRAIN_IMPL_BEGIN
#include <nlohmann/json.hpp>
DTRAIN_IMPL_END
