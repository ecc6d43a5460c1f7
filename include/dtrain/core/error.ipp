// The definitions error.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/core/error.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

namespace dtrain::detail {

DTRAIN_DECL std::string format_error(const std::string& what, const std::string& fix,
                                     const std::source_location& where) {
  std::string msg = what;
  if (!fix.empty()) msg += "\n  fix: " + fix;
  msg += "\n  at: ";
  msg += where.file_name();
  msg += ':';
  msg += std::to_string(where.line());
  return msg;
}

}  // namespace dtrain::detail

DTRAIN_IMPL_END
