// The regular expressions of io/pattern.hpp against Python's re.fullmatch:
// a table of patterns and names whose expectations Python printed, each
// construct among them; what the matcher does not take, refused by name;
// and patterns that make a backtracking matcher take exponential time,
// answered in time linear in the text.
#define BOOST_TEST_MODULE io_pattern
#include "dtrain/io/pattern.hpp"

#include <chrono>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

using dtrain::RegexPattern;

namespace {

// What compiling `pattern` says: its config_error's message, or "" when it compiles.
std::string refusal(const std::string& pattern) {
  try {
    (void)RegexPattern(pattern);
  } catch (const dtrain::config_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// A pattern matches the whole name or nothing: never a part of it.
BOOST_AUTO_TEST_CASE(a_match_is_of_the_whole_text) {
  const std::string name = "model.layers.0.self_attn.q_proj";
  BOOST_TEST(!RegexPattern("q_proj").full_match(name));
  BOOST_TEST(!RegexPattern("model").full_match(name));
  BOOST_TEST(!RegexPattern(R"(layers\.0)").full_match(name));
  BOOST_TEST(!RegexPattern(R"(model\.layers\.\d)").full_match(name));
  BOOST_TEST(RegexPattern(".*q_proj").full_match(name));
  BOOST_TEST(RegexPattern(R"(model\.layers\.\d\..*)").full_match(name));
  BOOST_TEST(RegexPattern(name).full_match(name));  // its dots match themselves too
  // Alternatives are of the whole pattern: either whole alternative matches the whole name.
  BOOST_TEST(!RegexPattern("q_proj|model.*attn").full_match(name));
  BOOST_TEST(RegexPattern("q_proj|model.*proj").full_match(name));
}

// Every pattern on every name, against Python 3.11's answer: expected[i] is
// '1' where re.fullmatch(pattern, names[i]) matched, as printed by
//   for p in patterns: print(p, "".join("1" if re.fullmatch(p, n) else "0" for n in names))
// The names hold the literals that some patterns spell ("a{x}", "(a)", ...)
// and the characters \s takes (a tab, \x1c) and `.` does not (a newline).
BOOST_AUTO_TEST_CASE(matches_as_python_fullmatch) {
  const std::vector<std::string> names = {"model.layers.0.self_attn.q_proj",
                                          "model.layers.11.self_attn.v_proj",
                                          "model.layers.3.self_attn.k_proj",
                                          "model.layers.2.mlp.gate_proj",
                                          "model.layers.10.mlp.down_proj",
                                          "transformer.h.3.attn.c_attn",
                                          "transformer.h.0.mlp.c_proj",
                                          "lm_head",
                                          "q_proj",
                                          "",
                                          "a",
                                          "aa",
                                          "aaa",
                                          "ab",
                                          "b",
                                          "a.b",
                                          "a-b",
                                          "a{",
                                          "a{x}",
                                          "a{1,x}",
                                          "a{}",
                                          "a{ 1}",
                                          "x{,y}",
                                          "(a)",
                                          "]a",
                                          "a\tb",
                                          "a\034b",
                                          "a\nb",
                                          "12.3",
                                          "_"};
  const std::vector<std::pair<std::string, std::string>> patterns = {
      // PEFT's forms
      {R"(.*\.(q_proj|v_proj))", "110000000000000000000000000000"},
      {R"(model\.layers\.\d+\.self_attn\.(q|k|v)_proj)", "111000000000000000000000000000"},
      {R"(.*\.0\.self_attn\.(q|k)_proj)", "100000000000000000000000000000"},
      {".*(?:q|v)_proj", "110000001000000000000000000000"},
      {R"(.*?\.(?P<kind>q|k)_proj)", "101000000000000000000000000000"},
      {"^.*attn.*$", "111001000000000000000000000000"},
      {R"(.*layers\.1[0-9]\..*)", "010010000000000000000000000000"},
      {R"(lm_head|transformer\.h\.[0-3]\..*)", "000001110000000000000000000000"},
      {R"(.*\.(gate|up|down)_proj)", "000110000000000000000000000000"},
      {R"(.*mlp\.c_(fc|proj))", "000000100000000000000000000000"},
      {"q_proj", "000000001000000000000000000000"},
      {"lm_head", "000000010000000000000000000000"},
      {R"(model\.layers\.(1|3)\..*)", "001000000000000000000000000000"},
      {".*_proj", "111110101000000000000000000000"},
      {R"(.*\.\d\..*)", "101101100000000000000000000000"},
      // . and classes
      {".{3,7}", "000000011000100110111111011010"},
      {"q.proj", "000000001000000000000000000000"},
      {"a.b", "000000000000000110000000011000"},
      {"[a-z_.]+", "000000011011111100000000000001"},
      {".*[^0-9]proj", "111110101000000000000000000000"},
      {".*_pro[jk]", "111110101000000000000000000000"},
      {R"([\w.]+_proj)", "111110101000000000000000000000"},
      {"[]a]+", "000000000011100000000000100000"},
      {"[^]a]+", "000000001000001000000010000011"},
      {"[a-]+", "000000000011100000000000000000"},
      {"[-a]+", "000000000011100000000000000000"},
      {R"([\d.]+)", "000000000000000000000000000010"},
      {R"([\]\[()]+)", "000000000000000000000000000000"},
      {"[.]*", "000000000100000000000000000000"},
      {"[a-cx-z]+", "000000000011111000000000000000"},
      {"[^.]+", "000000011011111011111111111101"},
      {R"([\s_])", "000000000000000000000000000001"},
      {R"([^\S])", "000000000000000000000000000000"},
      {R"([\t-\r])", "000000000000000000000000000000"},
      {R"(a[\n]b)", "000000000000000000000000000100"},
      {"[^a]", "000000000000001000000000000001"},
      // escapes
      {R"(\d+)", "000000000000000000000000000000"},
      {R"(\d+\.\d)", "000000000000000000000000000010"},
      {R"(\w+)", "000000011011111000000000000001"},
      {R"(\s)", "000000000000000000000000000000"},
      {R"(a\sb)", "000000000000000000000000011100"},
      {R"(\D+)", "000000011011111111101011111101"},
      {R"(\W)", "000000000000000000000000000000"},
      {R"(\S+)", "111111111011111111111011100011"},
      {R"(a\.b)", "000000000000000100000000000000"},
      {R"(a\-b)", "000000000000000010000000000000"},
      {R"(\(a\))", "000000000000000000000001000000"},
      {R"(a\tb)", "000000000000000000000000010000"},
      {R"(a\nb)", "000000000000000000000000000100"},
      {R"(\_)", "000000000000000000000000000001"},
      {R"(a\{)", "000000000000000001000000000000"},
      {R"(a\{\})", "000000000000000000001000000000"},
      // groups and alternation
      {"(a|b)*", "000000000111111000000000000000"},
      {"(?:ab)+", "000000000000010000000000000000"},
      {"(?P<x>a)(?P<y>b)", "000000000000010000000000000000"},
      {"()", "000000000100000000000000000000"},
      {"(a|)", "000000000110000000000000000000"},
      {"a|", "000000000110000000000000000000"},
      {"|", "000000000100000000000000000000"},
      {"", "000000000100000000000000000000"},
      {"(|a)+", "000000000111100000000000000000"},
      {"((a))", "000000000010000000000000000000"},
      {"(a|ab)(b|)", "000000000010010000000000000000"},
      // quantifiers, greedy and lazy
      {"a*", "000000000111100000000000000000"},
      {"a+", "000000000011100000000000000000"},
      {"a?", "000000000110000000000000000000"},
      {"a{2}", "000000000001000000000000000000"},
      {"a{2,}", "000000000001100000000000000000"},
      {"a{,2}", "000000000111000000000000000000"},
      {"a{1,3}", "000000000011100000000000000000"},
      {"a{0}", "000000000100000000000000000000"},
      {"a{0,0}", "000000000100000000000000000000"},
      {"a{,}", "000000000111100000000000000000"},
      {"a{02}", "000000000001000000000000000000"},
      {"a*?", "000000000111100000000000000000"},
      {"a+?", "000000000011100000000000000000"},
      {"a??", "000000000110000000000000000000"},
      {"a{1,3}?", "000000000011100000000000000000"},
      {"a{2,}?", "000000000001100000000000000000"},
      {"(ab)?b?", "000000000100011000000000000000"},
      {"(a?){3}a{3}", "000000000000100000000000000000"},
      // braces that start no count are literals
      {"a{", "000000000000000001000000000000"},
      {"a{x}", "000000000000000000100000000000"},
      {"a{1,x}", "000000000000000000010000000000"},
      {"a{}", "000000000000000000001000000000"},
      {"a{ 1}", "000000000000000000000100000000"},
      {"x{,y}", "000000000000000000000010000000"},
      {"a{1", "000000000000000000000000000000"},
      // anchors
      {"^a+$", "000000000011100000000000000000"},
      {"^", "000000000100000000000000000000"},
      {"$", "000000000100000000000000000000"},
      {"^$", "000000000100000000000000000000"},
      {"^(a|b)$", "000000000010001000000000000000"},
      // nested loops
      {"(a*)*", "000000000111100000000000000000"},
      {"(a*)*b", "000000000000011000000000000000"},
      {"(a|a)*", "000000000111100000000000000000"},
      {"((a|a)*)*b", "000000000000011000000000000000"},
      {"(a+)+", "000000000011100000000000000000"},
  };
  for (const auto& [pattern, expected] : patterns) {
    BOOST_TEST_REQUIRE(expected.size() == names.size(), pattern);
    const RegexPattern compiled(pattern);
    for (std::size_t i = 0; i < names.size(); ++i)
      BOOST_TEST(compiled.full_match(names[i]) == (expected[i] == '1'), pattern << " on \"" << names[i] << "\"");
  }
}

// A text is UTF-8 and a character a code point; \d \w \s class a non-ASCII
// character as Python does with re.ASCII. Expectations from Python's
// re.fullmatch(pattern, text), with flags=re.ASCII for the second table.
BOOST_AUTO_TEST_CASE(a_character_is_a_code_point) {
  const std::vector<std::tuple<std::string, std::string, bool>> as_python = {{".", "é", true},
                                                                             {"..", "é", false},
                                                                             {"q.proj", "qéproj", true},
                                                                             {"[^.]+", "modèle", true},
                                                                             {R"(.*\.q_proj)", "modèle.q_proj", true},
                                                                             {"[^a]{2}", "éü", true},
                                                                             {"[a-z]+", "é", false},
                                                                             {R"((.)\.(.))", "é.ü", true}};
  const std::vector<std::tuple<std::string, std::string, bool>> as_python_ascii = {
      {R"(\w+)", "modèle", false}, {R"(\W)", "é", true},    {R"(\D)", "é", true},    {R"(\S)", "é", true},
      {R"(\s)", "é", false},       {R"([\w])", "é", false}, {R"([^\w])", "é", true}, {R"(mod\Sle)", "modèle", true}};
  for (const auto* table : {&as_python, &as_python_ascii})
    for (const auto& [pattern, text, expected] : *table)
      BOOST_TEST(RegexPattern(pattern).full_match(text) == expected, pattern << " on \"" << text << "\"");
}

// What the matcher does not take is a config_error naming it and where,
// with the fix; never another answer than Python's.
BOOST_AUTO_TEST_CASE(unsupported_constructs_are_refused_by_name) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      // Python takes these; dtrain does not
      {R"((a)\1)", "back-references are not supported (at character 4)"},
      {"(?P<n>a)(?P=n)", "back-references (?P=name) are not supported"},
      {R"(\0)", "octal escapes are not supported"},
      {R"(\101)", "octal escapes are not supported"},
      {R"([\1])", "octal escapes are not supported"},
      {"(?=x)x", "look-aheads (?=...) are not supported"},
      {"(?!x)y", "look-aheads (?!...) are not supported"},
      {"(?<=x)y", "look-behinds (?<=...) are not supported"},
      {"(?<!x)y", "look-behinds (?<!...) are not supported"},
      {"(?>a)", "atomic groups (?>...) are not supported"},
      {"(?#note)a", "comments (?#...) are not supported"},
      {"(?i)q_proj", "inline flags such as (?i) are not supported"},
      {"(?-i:a)", "inline flags such as (?i) are not supported"},
      {"(?<n>a)", "(? groups other than (?:...) and (?P<name>...) are not supported"},
      {R"(\bq_proj)", "the escape \\b is not supported"},
      {R"(q_proj\Z)", "the escape \\Z is not supported"},
      {R"(\x41)", "the escape \\x is not supported"},
      {"a*+", "stacked or possessive quantifiers are not supported"},
      {"a{2}+", "stacked or possessive quantifiers are not supported"},
      {"x|^a", "^ other than first"},
      {"a$|b", "$ other than last"},
      {"(^a)", "^ other than first"},
      {"é", "a non-ASCII character (at character 0)"},
      // limits that keep a hostile pattern cheap
      {"a{1001}", "a count over 1000"},
      {"a{2,5000}", "a count over 1000"},
      {"((a{100}){100}){100}", "more than 20000 states once its counts are expanded"},
      {std::string(101, '(') + std::string(101, ')'), "groups nested more than 100 deep"},
      // Python refuses these too
      {"(", "a missing )"},
      {"a)", "an unbalanced )"},
      {"a**", "stacked or possessive quantifiers are not supported"},
      {"a{2}{3}", "stacked or possessive quantifiers are not supported"},
      {"*a", "nothing to repeat"},
      {"a|+", "nothing to repeat"},
      {"{2}", "nothing to repeat"},
      {"^*", "nothing to repeat"},
      {"a{3,2}", "a count range {m,n} with n below m"},
      {"[z-a]", "a range whose end comes before its start"},
      {R"([\d-z])", "a class escape as the start of a range"},
      {R"([a-\d])", "a class escape as the end of a range"},
      {"[ab", "an unterminated ["},
      {"[]", "an unterminated ["},
      {"\\", "a trailing backslash"},
      {"(?P<a", "an unterminated group name"},
      {"(?P<1a>x)", "the group name \"1a\" is not an identifier"},
      {"(?P<>x)", "the group name \"\" is not an identifier"},
      {"(?P<a>x)(?P<a>y)", "the group name \"a\" is used twice"}};
  for (const auto& [pattern, says] : refused) {
    const std::string message = refusal(pattern);
    BOOST_TEST(message.find("the pattern \"" + pattern + "\" is not a regular expression dtrain takes: " + says) !=
                   std::string::npos,
               pattern << ": " << message);
    BOOST_TEST(message.find("write it with literals, ., [classes], \\d \\w \\s, (groups), | and one quantifier per "
                            "item") != std::string::npos,
               message);
  }
  // The deepest nesting taken, and a megabyte of '(' refused before it could exhaust the stack.
  BOOST_TEST(RegexPattern(std::string(100, '(') + std::string(100, ')')).full_match(""));
  BOOST_TEST(refusal(std::string(1 << 20, '(')).find("nested more than 100 deep") != std::string::npos);
}

// Nested loops and long counts: a backtracking matcher (std::regex, and
// Python's) takes time exponential in the text on these; the automaton
// follows at most (states) paths per character. Each answer takes
// milliseconds; the bound only tells a regression from a slow machine.
BOOST_AUTO_TEST_CASE(hostile_patterns_take_linear_time) {
  const auto start = std::chrono::steady_clock::now();
  const std::string as(100000, 'a');
  BOOST_TEST(!RegexPattern("(a*)*b").full_match(as));
  BOOST_TEST(RegexPattern("(a*)*b").full_match(as + "b"));
  BOOST_TEST(!RegexPattern("(.*)*(.*)*(.*)*(a|a)*x").full_match(as + "y"));
  BOOST_TEST(!RegexPattern("((a|a)*)*b").full_match(as));
  std::string words(20000, 'a');
  words += '.';
  BOOST_TEST(!RegexPattern(R"((\w+\.)*\w+_proj)").full_match(words));
  // a?{n}a{n} on a^n: every optional a skipped, 2^n ways for a backtracker to try first.
  std::string optional;
  for (int i = 0; i < 1000; ++i) optional += "a?";
  BOOST_TEST(RegexPattern(optional + "a{1000}").full_match(std::string(1000, 'a')));
  BOOST_TEST(!RegexPattern(optional + "a{1000}").full_match(std::string(999, 'a')));
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST(seconds < 20.0);
}
