// The definitions pattern.hpp declares with DTRAIN_DECL (core/macros.hpp).
#pragma once

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <string>

#include "dtrain/io/pattern.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  // The character every non-ASCII character of a text is matched as (a
  // pattern is ASCII, so only `.`, negated classes and \D \W \S hold it).
  inline constexpr unsigned char regex_non_ascii = 0x80;

  // A pattern parsed into a tree, before its automaton is built.
  struct RegexNode {
    enum Kind : std::uint8_t { chars, cat, alt, repeat } kind = cat;
    std::bitset<256> set{};
    std::vector<RegexNode> kids{};
    int min = 1, max = 1;  // repeat: max -1 is unbounded
  };

  // A count {m,n}: its bounds and the position after its '}'.
  struct RegexCount {
    long long min = 0, max = -1;  // max -1: unbounded
    std::size_t end = 0;
  };

  // Recursive descent into a RegexNode tree, then Thompson's construction:
  // sets of characters, splits and jumps.
  struct RegexCompiler {
    static constexpr std::size_t max_states = 20000;
    static constexpr long long max_count = 1000;
    static constexpr int max_depth = 100;
    std::string_view p;
    std::size_t at = 0;
    int depth = 0;                       // groups open at `at`
    std::set<std::string_view> names{};  // (?P<name>...) so far
    std::vector<RegexInst> prog{};

    [[noreturn]] void refuse(const std::string& why) const {
      throw config_error("the pattern \"" + std::string(p) + "\" is not a regular expression dtrain takes: " + why +
                             " (at character " + std::to_string(std::min(at, p.size())) + ")",
                         "write it with literals, ., [classes], \\d \\w \\s, (groups), | and one quantifier per item");
    }
    bool end() const { return at >= p.size(); }
    char peek() const { return end() ? '\0' : p[at]; }

    static std::bitset<256> one(unsigned char c) {
      std::bitset<256> b;
      b.set(c);
      return b;
    }
    static std::bitset<256> range(unsigned char lo, unsigned char hi) {
      std::bitset<256> b;
      for (unsigned c = lo; c <= hi; ++c) b.set(c);
      return b;
    }
    // \d \w \s and their complements; none when `c` names no class.
    static std::optional<std::bitset<256>> class_escape(char c) {
      std::bitset<256> b;
      switch (c) {
        case 'd':
        case 'D': b = range('0', '9'); break;
        case 'w':
        case 'W': b = range('0', '9') | range('a', 'z') | range('A', 'Z') | one('_'); break;
        case 's':
        case 'S': b = range('\t', '\r') | range(0x1c, 0x1f) | one(' '); break;  // as Python's str.isspace
        default: return std::nullopt;
      }
      return std::isupper(static_cast<unsigned char>(c)) ? ~b : b;
    }
    static bool octal(char c) { return c >= '0' && c <= '7'; }
    // The character an escape stands for (after the backslash, at `at`).
    unsigned char escaped_char(bool in_class) {
      const char c = p[at];
      const char* controls = "n\nt\tr\rf\fv\v";
      for (const char* k = controls; *k; k += 2)
        if (c == k[0]) return ++at, static_cast<unsigned char>(k[1]);
      // Python reads digits in a class, \0 and three octal digits as a character, other digits as a group's number.
      if (c == '0' || (in_class && octal(c)) || (at + 2 < p.size() && octal(c) && octal(p[at + 1]) && octal(p[at + 2])))
        refuse("octal escapes are not supported");
      if (std::isdigit(static_cast<unsigned char>(c))) refuse("back-references are not supported");
      if (std::isalpha(static_cast<unsigned char>(c))) refuse(std::string("the escape \\") + c + " is not supported");
      ++at;
      return static_cast<unsigned char>(c);
    }

    RegexNode alternatives() {
      RegexNode first = sequence();
      if (peek() != '|') return first;
      RegexNode n{.kind = RegexNode::alt};
      n.kids.push_back(std::move(first));
      while (peek() == '|') {
        ++at;
        n.kids.push_back(sequence());
      }
      return n;
    }
    RegexNode sequence() {
      RegexNode n{.kind = RegexNode::cat};
      while (!end() && peek() != '|' && peek() != ')') n.kids.push_back(repeated());
      return n;
    }
    // The count {m}, {m,}, {,n} or {m,n} starting at `i` ('{'); none when the
    // brace starts no count (Python then reads it as a literal).
    std::optional<RegexCount> count_at(std::size_t i) const {
      const auto number = [&](std::optional<long long>& v) {
        for (; i < p.size() && std::isdigit(static_cast<unsigned char>(p[i])); ++i)
          v = std::min(v.value_or(0) * 10 + (p[i] - '0'), max_count + 1);
      };
      std::optional<long long> lo, hi;
      ++i;
      number(lo);
      if (i < p.size() && p[i] == '}') {
        if (!lo) return std::nullopt;
        hi = lo;
      } else if (i < p.size() && p[i] == ',') {
        ++i;
        number(hi);
        if (i >= p.size() || p[i] != '}') return std::nullopt;
      } else {
        return std::nullopt;
      }
      return RegexCount{lo.value_or(0), hi.value_or(-1), i + 1};
    }
    bool quantifier_next() const {
      const char q = peek();
      return q == '*' || q == '+' || q == '?' || (q == '{' && count_at(at));
    }
    RegexNode repeated() {
      const char c = p[at];
      if (c == '^' || c == '$') {  // re.fullmatch starts at the first character and ends after the last
        if (c == '^' ? at != 0 : at + 1 != p.size()) refuse(c == '^' ? "^ other than first" : "$ other than last");
        ++at;
        if (quantifier_next()) refuse("nothing to repeat");
        return RegexNode{.kind = RegexNode::cat};
      }
      RegexNode item = atom();
      int min = 1, max = 1;
      const char q = peek();
      if (q == '*')
        min = 0, max = -1, ++at;
      else if (q == '+')
        min = 1, max = -1, ++at;
      else if (q == '?')
        min = 0, max = 1, ++at;
      else if (const auto count = q == '{' ? count_at(at) : std::nullopt) {
        if (count->min > max_count || count->max > max_count) refuse("a count over " + std::to_string(max_count));
        if (count->max >= 0 && count->max < count->min) refuse("a count range {m,n} with n below m");
        min = static_cast<int>(count->min);
        max = static_cast<int>(count->max);
        at = count->end;
      } else {
        return item;
      }
      if (peek() == '?') ++at;  // lazy: the same texts match in full
      if (quantifier_next()) refuse("stacked or possessive quantifiers are not supported");
      RegexNode n{.kind = RegexNode::repeat, .min = min, .max = max};
      n.kids.push_back(std::move(item));
      return n;
    }
    // Why a group "(?..." other than (?:...) and (?P<name>...) is refused.
    static std::string unsupported_group(std::string_view g) {
      for (const auto& [start, what] : {std::pair<std::string_view, std::string_view>{"?=", "look-aheads (?=...)"},
                                        {"?!", "look-aheads (?!...)"},
                                        {"?<=", "look-behinds (?<=...)"},
                                        {"?<!", "look-behinds (?<!...)"},
                                        {"?P=", "back-references (?P=name)"},
                                        {"?#", "comments (?#...)"},
                                        {"?>", "atomic groups (?>...)"},
                                        {"?(", "conditional groups (?(...)...)"}})
        if (g.starts_with(start)) return std::string(what) + " are not supported";
      if (g.size() > 1 && (std::isalpha(static_cast<unsigned char>(g[1])) || g[1] == '-'))
        return "inline flags such as (?i) are not supported";
      return "(? groups other than (?:...) and (?P<name>...) are not supported";
    }
    // (?P<name> at `at`: a Python identifier, unique in the pattern.
    void group_name() {
      at += 3;
      const auto close = p.find('>', at);
      if (close == std::string_view::npos) refuse("an unterminated group name");
      const std::string_view name = p.substr(at, close - at);
      const bool identifier = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                              std::all_of(name.begin(), name.end(), [](char ch) {
                                return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
                              });
      if (!identifier) refuse("the group name \"" + std::string(name) + "\" is not an identifier");
      if (!names.insert(name).second) refuse("the group name \"" + std::string(name) + "\" is used twice");
      at = close + 1;
    }
    RegexNode atom() {
      const char c = p[at];
      if (quantifier_next()) refuse("nothing to repeat");
      if (c == '(') {
        if (++depth > max_depth) refuse("groups nested more than " + std::to_string(max_depth) + " deep");
        ++at;
        if (peek() == '?') {
          if (p.substr(at).starts_with("?:"))
            at += 2;
          else if (p.substr(at).starts_with("?P<"))
            group_name();
          else
            refuse(unsupported_group(p.substr(at)));
        }
        RegexNode inner = alternatives();
        if (peek() != ')') refuse("a missing )");
        ++at;
        --depth;
        return inner;
      }
      if (c == '[') return bracket();
      if (c == '.') return ++at, RegexNode{.kind = RegexNode::chars, .set = ~one('\n')};
      if (c == '\\') {
        if (++at >= p.size()) refuse("a trailing backslash");
        if (const auto b = class_escape(p[at])) return ++at, RegexNode{.kind = RegexNode::chars, .set = *b};
        return RegexNode{.kind = RegexNode::chars, .set = one(escaped_char(false))};
      }
      return ++at, RegexNode{.kind = RegexNode::chars, .set = one(static_cast<unsigned char>(c))};
    }
    RegexNode bracket() {
      ++at;  // '['
      const bool negate = peek() == '^';
      if (negate) ++at;
      std::bitset<256> set;
      // A '-' after an item, not before the closing ']', makes a range.
      const auto range_next = [&] { return peek() == '-' && at + 1 < p.size() && p[at + 1] != ']'; };
      for (bool first = true; first || peek() != ']'; first = false) {
        if (end()) refuse("an unterminated [");
        unsigned char lo = 0;
        if (p[at] == '\\') {
          if (++at >= p.size()) refuse("a trailing backslash");
          if (const auto b = class_escape(p[at])) {
            ++at;
            if (range_next()) refuse("a class escape as the start of a range");
            set |= *b;
            continue;
          }
          lo = escaped_char(true);
        } else {
          lo = static_cast<unsigned char>(p[at++]);
        }
        if (!range_next()) {
          set.set(lo);
          continue;
        }
        ++at;  // '-'
        unsigned char hi = static_cast<unsigned char>(p[at]);
        if (hi == '\\') {
          if (++at >= p.size()) refuse("a trailing backslash");
          if (class_escape(p[at])) refuse("a class escape as the end of a range");
          hi = escaped_char(true);
        } else {
          ++at;
        }
        if (hi < lo) refuse("a range whose end comes before its start");
        set |= range(lo, hi);
      }
      ++at;  // ']'
      return RegexNode{.kind = RegexNode::chars, .set = negate ? ~set : set};
    }

    std::int32_t push(RegexInst i) {
      if (prog.size() >= max_states)
        refuse("more than " + std::to_string(max_states) + " states once its counts are expanded");
      prog.push_back(i);
      return static_cast<std::int32_t>(prog.size() - 1);
    }
    std::int32_t here() const { return static_cast<std::int32_t>(prog.size()); }
    void emit(const RegexNode& n) {
      switch (n.kind) {
        case RegexNode::chars: push({.op = RegexInst::chars, .set = n.set}); return;
        case RegexNode::cat:
          for (const auto& k : n.kids) emit(k);
          return;
        case RegexNode::alt: {
          std::vector<std::int32_t> jumps;
          for (std::size_t i = 0; i + 1 < n.kids.size(); ++i) {
            const auto s = push({.op = RegexInst::split});
            prog[s].x = here();
            emit(n.kids[i]);
            jumps.push_back(push({.op = RegexInst::jump}));
            prog[s].y = here();
          }
          emit(n.kids.back());
          for (const auto j : jumps) prog[j].x = here();
          return;
        }
        case RegexNode::repeat: {
          for (int i = 0; i < n.min; ++i) emit(n.kids[0]);
          if (n.max < 0) {  // a loop: split into the body or out; the body jumps back
            const auto s = push({.op = RegexInst::split});
            prog[s].x = here();
            emit(n.kids[0]);
            const auto j = push({.op = RegexInst::jump});
            prog[j].x = s;
            prog[s].y = here();
            return;
          }
          std::vector<std::int32_t> exits;  // each optional copy may be the last
          for (int i = n.min; i < n.max; ++i) {
            exits.push_back(push({.op = RegexInst::split}));
            prog[exits.back()].x = here();
            emit(n.kids[0]);
          }
          for (const auto e : exits) prog[e].y = here();
          return;
        }
      }
    }
  };

  }  // namespace detail

  DTRAIN_DECL RegexPattern::RegexPattern(std::string_view pattern) {
    detail::RegexCompiler c{.p = pattern};
    for (; c.at < pattern.size(); ++c.at)
      if (static_cast<unsigned char>(pattern[c.at]) >= 0x80) c.refuse("a non-ASCII character");
    c.at = 0;
    const detail::RegexNode tree = c.alternatives();
    if (!c.end()) c.refuse("an unbalanced )");
    c.emit(tree);
    c.push({.op = detail::RegexInst::match});
    prog_ = std::move(c.prog);
  }

  DTRAIN_DECL bool RegexPattern::full_match(std::string_view text) const {
    using detail::RegexInst;
    // Every state the automaton can be in after each character (Thompson):
    // each state once per step, so the work is text length x states.
    std::vector<std::int32_t> now, next, stack;
    std::vector<std::size_t> seen(prog_.size(), 0);
    std::size_t step = 1;
    const auto add = [&](std::vector<std::int32_t>& list, std::int32_t start) {
      stack.assign(1, start);
      while (!stack.empty()) {
        const auto pc = stack.back();
        stack.pop_back();
        if (seen[static_cast<std::size_t>(pc)] == step) continue;
        seen[static_cast<std::size_t>(pc)] = step;
        const RegexInst& i = prog_[static_cast<std::size_t>(pc)];
        if (i.op == RegexInst::jump)
          stack.push_back(i.x);
        else if (i.op == RegexInst::split)
          stack.push_back(i.y), stack.push_back(i.x);
        else
          list.push_back(pc);
      }
    };
    add(now, 0);
    for (std::size_t at = 0; at < text.size(); ++at) {
      auto ch = static_cast<unsigned char>(text[at]);
      if (ch >= 0x80) {  // a code point: its lead byte and continuation bytes
        ch = detail::regex_non_ascii;
        while (at + 1 < text.size() && (static_cast<unsigned char>(text[at + 1]) & 0xC0) == 0x80) ++at;
      }
      ++step;
      next.clear();
      for (const auto pc : now) {
        const RegexInst& i = prog_[static_cast<std::size_t>(pc)];
        if (i.op == RegexInst::chars && i.set.test(ch)) add(next, pc + 1);
      }
      now.swap(next);
      if (now.empty()) return false;
    }
    for (const auto pc : now)
      if (prog_[static_cast<std::size_t>(pc)].op == RegexInst::match) return true;
    return false;
  }

}  // namespace dtrain

DTRAIN_IMPL_END
