// The definitions error.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>

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

  DTRAIN_DECL std::int64_t unix_now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

}  // namespace dtrain::detail

namespace dtrain {

DTRAIN_DECL void record_failure(const std::exception& e, int code) noexcept {
  try {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (!path || !*path) return;
    const auto* ours = dynamic_cast<const error*>(&e);
    const std::int64_t raised = ours ? ours->raised_at_us() : detail::unix_now_us();
    std::string text = "{\"message\": \"";
    for (const char c : std::string(e.what())) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '"' || c == '\\') {
        text += '\\';
        text += c;
      } else if (c == '\n') {
        text += "\\n";
      } else if (u < 0x20) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(u));
        text += hex;
      } else {
        text += c;
      }
    }
    // torchrun reads "message" and "timestamp" (whole seconds, as a string);
    // dtrain-run reads the rest.
    text += "\", \"timestamp\": \"" + std::to_string(raised / 1000000) +
            "\", \"dtrain\": {\"exit_code\": " + std::to_string(code) +
            ", \"raised_at_us\": " + std::to_string(raised) + "}}\n";
    // Written whole, then renamed: the launcher never reads half a record.
    const std::string part = std::string(path) + ".part";
    std::FILE* f = std::fopen(part.c_str(), "w");
    if (!f) return;
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !written || std::rename(part.c_str(), path) != 0) std::remove(part.c_str());
  } catch (...) {  // out of memory while failing: the launcher falls back to the order ranks ended in
  }
}

DTRAIN_DECL std::string signal_name(int sig) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
#else
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGKILL: return "SIGKILL";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: break;
  }
#endif
  return "signal " + std::to_string(sig);
}

}  // namespace dtrain

DTRAIN_IMPL_END
