// The layer order of docs/design.md, enforced: a header under
// include/dtrain/<layer>/ includes only headers of its own layer or of layers
// before it. The order is read from the design page itself (the backquoted
// `core < device < ...` line), so the rule and its check cannot drift apart.
// The umbrella header dtrain/trainer.hpp may include anything; dtrain/
// version.hpp counts as core. Also the tests' layout: a tests/<layer>/
// folder for every include/dtrain/<layer>/, and one naming convention for
// test sources (<what>_test.cpp or .cu).
#define BOOST_TEST_MODULE include_order
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path repo = DTRAIN_SOURCE_DIR;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The layers, lowest first, from the design page's `a < b < ...` line.
std::vector<std::string> layer_order() {
  const std::string page = read(repo / "docs/design.md");
  const std::regex chain("`(core( < [a-z_]+)+)`");
  std::smatch m;
  BOOST_TEST_REQUIRE(std::regex_search(page, m, chain), "docs/design.md has no `core < device < ...` line");
  std::vector<std::string> layers;
  std::stringstream in(m[1].str());
  for (std::string word; in >> word;)
    if (word != "<") layers.push_back(word);
  return layers;
}

struct Violation {
  std::string where;  // file:line
  std::string text;
};

// The includes of `text` (a header of layer `layer`) that go up the order.
std::vector<Violation> upward_includes(const std::string& file, const std::string& layer, const std::string& text,
                                       const std::vector<std::string>& order, int& includes_seen) {
  std::map<std::string, std::size_t> rank;
  for (std::size_t i = 0; i < order.size(); ++i) rank[order[i]] = i;
  const std::regex include(R"(^\s*#\s*include\s*[<"]dtrain/([a-z_]+)/[^">]+[">])");
  std::vector<Violation> out;
  std::stringstream in(text);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    std::smatch m;
    if (!std::regex_search(line, m, include)) continue;
    ++includes_seen;
    const std::string target = m[1].str();
    if (!rank.contains(target) || rank.at(target) > rank.at(layer))
      out.push_back({file + ":" + std::to_string(line_no), line});
  }
  return out;
}

std::string allowed(const std::vector<std::string>& order, const std::string& layer) {
  std::string out;
  for (const auto& l : order) {
    out += (out.empty() ? "" : ", ") + l;
    if (l == layer) break;
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_folder_has_a_place_in_the_order) {
  const auto order = layer_order();
  for (const auto& e : fs::directory_iterator(repo / "include/dtrain"))
    if (e.is_directory())
      BOOST_TEST((std::find(order.begin(), order.end(), e.path().filename().string()) != order.end()),
                 "include/dtrain/" << e.path().filename().string()
                                   << "/ is not in the layer order: add it to the layer order in docs/design.md");
}

BOOST_AUTO_TEST_CASE(no_header_includes_a_later_layer) {
  const auto order = layer_order();
  int seen = 0;
  for (const auto& e : fs::recursive_directory_iterator(repo / "include/dtrain")) {
    const auto ext = e.path().extension();
    if (!e.is_regular_file() || (ext != ".hpp" && ext != ".cuh" && ext != ".ipp")) continue;
    const fs::path rel = fs::relative(e.path(), repo / "include");
    std::string layer = rel.parent_path().filename().string();
    if (rel.parent_path() == "dtrain") {
      if (rel.filename() == "trainer.hpp") continue;  // the umbrella
      layer = "core";
    }
    if (std::find(order.begin(), order.end(), layer) == order.end()) continue;  // reported above
    for (const auto& v : upward_includes(rel.string(), layer, read(e.path()), order, seen))
      BOOST_ERROR(v.where << ": " << v.text << ": a " << layer << " header may include only "
                          << allowed(order, layer) << " (docs/design.md, Layers)");
  }
  BOOST_TEST(seen > 50, "found only " << seen << " dtrain includes: is the scan looking at the headers?");
}

// The checker itself: an upward include in a made-up header is reported, one
// within the order is not.
BOOST_AUTO_TEST_CASE(the_check_can_fail) {
  const std::vector<std::string> order{"core", "device", "comm", "launch"};
  int seen = 0;
  const auto bad = upward_includes("dtrain/device/fake.hpp", "device",
                                   "#include \"dtrain/core/error.hpp\"\n#include <dtrain/launch/env.hpp>\n", order, seen);
  BOOST_TEST(seen == 2);
  BOOST_TEST_REQUIRE(bad.size() == 1u);
  BOOST_TEST(bad[0].where == "dtrain/device/fake.hpp:2");
  const auto unknown = upward_includes("dtrain/core/x.hpp", "core", "#include \"dtrain/nowhere/x.hpp\"\n", order, seen);
  BOOST_TEST(unknown.size() == 1u);
}

// The test of include/dtrain/<layer>/x.hpp is found under tests/<layer>/.
BOOST_AUTO_TEST_CASE(every_layer_has_a_test_folder) {
  for (const auto& e : fs::directory_iterator(repo / "include/dtrain"))
    if (e.is_directory())
      BOOST_TEST(fs::is_directory(repo / "tests" / e.path().filename()),
                 "include/dtrain/" << e.path().filename().string() << "/ has no tests/"
                                   << e.path().filename().string() << "/ folder");
}

// Every source that defines test cases is named <what>_test.cpp (or .cu).
BOOST_AUTO_TEST_CASE(test_sources_follow_one_naming_convention) {
  int tests = 0;
  for (const auto& e : fs::recursive_directory_iterator(repo / "tests")) {
    const auto ext = e.path().extension();
    if (!e.is_regular_file() || (ext != ".cpp" && ext != ".cu")) continue;
    if (read(e.path()).find("BOOST_AUTO_TEST_CASE(") == std::string::npos) continue;
    ++tests;
    const std::string stem = e.path().stem().string();
    BOOST_TEST(stem.ends_with("_test"), fs::relative(e.path(), repo).string()
                                            << " defines test cases: name it <what>_test" << ext.string());
  }
  BOOST_TEST(tests > 20, "found only " << tests << " test sources");
}
