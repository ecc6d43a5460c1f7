#pragma once
// A regular expression matched against a whole text: the subset of Python's
// `re` that PEFT's target_modules patterns use (`.*\.(q_proj|v_proj)`,
// `model\.layers\.\d+\.self_attn\.(q|k|v)_proj`), answering as Python's
// re.fullmatch does: the pattern matches the whole text or nothing, never a
// part of it ("q_proj" does not match "model.q_proj").
//
// The syntax, as Python reads it:
//   literals; `.` (any character but a newline); classes `[a-z_]` `[^0-9]`
//   (ranges, escapes inside, `]` first and `-` first or last as literals);
//   the class escapes `\d \w \s` and their complements `\D \W \S`; the
//   escapes `\n \t \r \f \v` and escaped punctuation (`\.` `\(` `\-`);
//   groups `(...)`, `(?:...)`, `(?P<name>...)`; alternation `|` (an empty
//   alternative too); one quantifier per item, `*` `+` `?` `{m}` `{m,}`
//   `{,n}` `{m,n}`, greedy or lazy (`*?`: which one changes where a search
//   stops, not whether a whole text matches); `^` as the first character and
//   `$` as the last. A `{` that starts no count is a literal, as in Python.
// Characters: the text is UTF-8 and a character is a code point (`.` and
// `[^.]` take "é" whole); the pattern is ASCII. `\d \w \s` are Python's on
// ASCII (digits; letters, digits and `_`; space, \t \n \v \f \r and
// \x1c-\x1f); a non-ASCII character is in `\D \W \S`, as with Python's
// re.ASCII (without it Python counts "é" in `\w`). Module names are ASCII.
//
// Anything else is refused with a config_error naming it, never answered
// differently: back-references (\1, (?P=name)), octal escapes, look-arounds,
// atomic groups, inline flags, comments, conditional groups, other escapes
// (\b \A \Z \x41 ...), stacked or possessive quantifiers (a** a*+), `^` or
// `$` elsewhere, non-ASCII characters, and the patterns Python itself
// rejects (a quantifier with nothing to repeat, an unbalanced parenthesis,
// an unterminated class, a reversed range, a bad group name). So that a
// hostile pattern stays cheap, so are counts over 1000, groups nested more
// than 100 deep and patterns of more than 20,000 states once their counts
// are expanded.
//
// Time linear in the text: the pattern compiles to a nondeterministic
// automaton (Thompson's construction) whose every reachable state the match
// follows at once, character by character, so it takes at most text length
// x states steps whatever the pattern. std::regex is not used: libstdc++'s
// matcher backtracks and recurses once per character, so a pattern such as
// `(a*)*b` takes exponential time and a long text overflows the stack; the
// patterns come from adapter_config.json files anyone can write, and fuzzing
// found one that kept std::regex busy for minutes.

#include <bitset>
#include <cstdint>
#include <string_view>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain {

namespace detail {
// One state of a compiled pattern: take one character of `set` (chars),
// continue at x and at y (split), continue at x (jump), or accept (match).
struct RegexInst {
  enum Op : std::uint8_t { chars, split, jump, match } op;
  std::int32_t x = 0, y = 0;
  std::bitset<256> set{};
};
}  // namespace detail

class RegexPattern {
 public:
  // Compiles `pattern`; a config_error names what it does not take and where.
  DTRAIN_DECL explicit RegexPattern(std::string_view pattern);
  // Whether the whole of `text` matches (Python's re.fullmatch).
  DTRAIN_DECL bool full_match(std::string_view text) const;

 private:
  std::vector<detail::RegexInst> prog_;  // state 0 first
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/io/pattern.ipp"
#endif
