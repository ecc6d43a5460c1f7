// The layer order of docs/design.md, enforced: a header under
// include/dtrain/<layer>/ includes only headers of its own layer or of layers
// before it. The order is read from the design page itself (the backquoted
// `core < device < ...` line), so the rule and its check cannot drift apart.
// The umbrella header dtrain/trainer.hpp may include anything; dtrain/
// version.hpp counts as core.
//
// The backends: include/dtrain/backend/<name>/<file> sits at the layer its
// file name's first word names (device_isa.hpp: device, comm_nccl.hpp: comm,
// train_instances.hpp: train). It may include generic headers of its layer
// or below and, of that layer or below, its own backend's files and the host
// backend's (the base every backend builds on: a GPU rank's host transport
// runs on the host communicator, offloaded state lives on the Host device),
// never another backend's. No generic header includes anything under
// backend/; backend/backends.hpp, the list of backends, is the umbrella's
// alone. Every backend folder has a train_instances.hpp (its instance list).
//
// Also the tests' layout: a tests/<layer>/ folder for every
// include/dtrain/<layer>/ (a backend's tests live in the folders of the
// layers its files sit at), and one naming convention for test sources
// (<what>_test.cpp or .cu).
#define BOOST_TEST_MODULE include_order
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

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

const std::string backend_dir = "backend";
// The backend every backend may build on.
const std::string base_backend = "host";

// Where a header sits: its layer and, for a backend's file, the backend.
// `layer` is empty for what no header may include (the umbrella, the list
// of backends) and for a path of no known shape.
struct Place {
  std::string layer;
  std::string backend;  // empty: a generic header
};

// The place of dtrain/<rel> (rel as in an #include, without "dtrain/").
Place place_of(const std::string& rel) {
  const auto slash = rel.find('/');
  if (slash == std::string::npos) return {rel == "version.hpp" ? "core" : "", ""};
  const std::string folder = rel.substr(0, slash), rest = rel.substr(slash + 1);
  if (folder != backend_dir) return {folder, ""};
  const auto second = rest.find('/');
  if (second == std::string::npos) return {"", ""};  // backend/backends.hpp
  const std::string file = rest.substr(second + 1);
  return {file.substr(0, file.find_first_of("_.")), rest.substr(0, second)};
}

// The includes of `text` (the header dtrain/<file>, at `me`) that break the
// rules above.
std::vector<Violation> bad_includes(const std::string& file, const Place& me, const std::string& text,
                                    const std::vector<std::string>& order, int& includes_seen) {
  std::map<std::string, std::size_t> rank;
  for (std::size_t i = 0; i < order.size(); ++i) rank[order[i]] = i;
  const std::regex include(R"(^\s*#\s*include\s*[<"]dtrain/([^">]+)[">])");
  std::vector<Violation> out;
  std::stringstream in(text);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    std::smatch m;
    if (!std::regex_search(line, m, include)) continue;
    ++includes_seen;
    const Place target = place_of(m[1].str());
    const bool ordered = rank.contains(target.layer) && rank.at(target.layer) <= rank.at(me.layer);
    const bool own_or_base = target.backend == me.backend || target.backend == base_backend;
    const bool reachable = target.backend.empty() || (!me.backend.empty() && own_or_base);
    if (!ordered || !reachable) out.push_back({"dtrain/" + file + ":" + std::to_string(line_no), line});
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

// The backend folders (by name) that lack an instance list.
std::vector<std::string> backends_without_instances(const std::map<std::string, std::vector<std::string>>& files) {
  std::vector<std::string> out;
  for (const auto& [backend, names] : files)
    if (std::find(names.begin(), names.end(), "train_instances.hpp") == names.end()) out.push_back(backend);
  return out;
}

// Every backend folder and the files in it.
std::map<std::string, std::vector<std::string>> backend_files() {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& dir : fs::directory_iterator(repo / "include/dtrain" / backend_dir))
    if (dir.is_directory())
      for (const auto& f : fs::directory_iterator(dir.path()))
        out[dir.path().filename().string()].push_back(f.path().filename().string());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_folder_has_a_place_in_the_order) {
  const auto order = layer_order();
  for (const auto& e : fs::directory_iterator(repo / "include/dtrain"))
    if (e.is_directory() && e.path().filename() != backend_dir)
      BOOST_TEST((std::find(order.begin(), order.end(), e.path().filename().string()) != order.end()),
                 "include/dtrain/" << e.path().filename().string()
                                   << "/ is not in the layer order: add it to the layer order in docs/design.md");
}

BOOST_AUTO_TEST_CASE(every_backend_file_sits_at_a_layer_and_every_backend_has_an_instance_list) {
  const auto order = layer_order();
  const auto files = backend_files();
  BOOST_TEST(files.contains(base_backend), "include/dtrain/backend/" << base_backend << "/ is missing");
  for (const auto& [backend, names] : files)
    for (const auto& name : names) {
      const std::string layer = place_of(backend_dir + "/" + backend + "/" + name).layer;
      BOOST_TEST((std::find(order.begin(), order.end(), layer) != order.end()),
                 "include/dtrain/backend/" << backend << "/" << name << ": a backend's file name starts with the "
                                           << "layer it sits at (device_..., comm_..., train_...), not '" << layer
                                           << "'");
    }
  for (const auto& backend : backends_without_instances(files))
    BOOST_ERROR("include/dtrain/backend/" << backend
                                          << "/ has no train_instances.hpp: every backend lists its instances there");
  for (const auto& e : fs::directory_iterator(repo / "include/dtrain" / backend_dir))
    if (e.is_regular_file())
      BOOST_TEST(e.path().filename() == "backends.hpp", "include/dtrain/backend/"
                                                            << e.path().filename().string()
                                                            << ": only backends.hpp sits beside the backend folders");
}

BOOST_AUTO_TEST_CASE(no_header_includes_a_later_layer) {
  const auto order = layer_order();
  int seen = 0, backend_headers = 0;
  for (const auto& e : fs::recursive_directory_iterator(repo / "include/dtrain")) {
    const auto ext = e.path().extension();
    if (!e.is_regular_file() || (ext != ".hpp" && ext != ".cuh" && ext != ".ipp")) continue;
    const std::string rel = fs::relative(e.path(), repo / "include/dtrain").string();
    if (rel == "trainer.hpp" || rel == backend_dir + "/backends.hpp") continue;  // the umbrella and its list
    const Place me = place_of(rel);
    if (std::find(order.begin(), order.end(), me.layer) == order.end()) continue;  // reported above
    backend_headers += me.backend.empty() ? 0 : 1;
    for (const auto& v : bad_includes(rel, me, read(e.path()), order, seen))
      BOOST_ERROR(v.where << ": " << v.text << ": a " << (me.backend.empty() ? "" : me.backend + " backend's ")
                          << me.layer << " header may include only "
                          << (me.backend.empty() ? "generic headers"
                                                 : "generic headers and its own or the " + base_backend + " backend's")
                          << " of the layers " << allowed(order, me.layer) << " (docs/design.md, Layers)");
  }
  BOOST_TEST(seen > 50, "found only " << seen << " dtrain includes: is the scan looking at the headers?");
  BOOST_TEST(backend_headers > 10, "found only " << backend_headers << " backend headers");
}

// The checker itself: an upward include in a made-up header is reported, one
// within the order is not.
BOOST_AUTO_TEST_CASE(the_check_can_fail) {
  const std::vector<std::string> order{"core", "device", "comm", "launch"};
  int seen = 0;
  const auto bad = bad_includes("device/fake.hpp", place_of("device/fake.hpp"),
                                "#include \"dtrain/core/error.hpp\"\n#include <dtrain/launch/env.hpp>\n", order, seen);
  BOOST_TEST(seen == 2);
  BOOST_TEST_REQUIRE(bad.size() == 1u);
  BOOST_TEST(bad[0].where == "dtrain/device/fake.hpp:2");
  const auto unknown =
      bad_includes("core/x.hpp", place_of("core/x.hpp"), "#include \"dtrain/nowhere/x.hpp\"\n", order, seen);
  BOOST_TEST(unknown.size() == 1u);
}

// The backend rule: a backend's file is at its name's layer; it reaches its
// own backend and the host backend at or below that layer, never another
// backend, and no generic header reaches a backend.
BOOST_AUTO_TEST_CASE(the_backend_check_can_fail) {
  const std::vector<std::string> order{"core", "device", "comm", "offload", "train"};
  BOOST_TEST(place_of("backend/cuda/comm_nccl.hpp").layer == "comm");
  BOOST_TEST(place_of("backend/cuda/comm_nccl.hpp").backend == "cuda");
  BOOST_TEST(place_of("backend/host/device.ipp").layer == "device");
  BOOST_TEST(place_of("backend/backends.hpp").layer.empty());
  int seen = 0;
  const std::string text =
      "#include \"dtrain/core/error.hpp\"\n"            // generic, below: fine
      "#include \"dtrain/backend/cuda/device.hpp\"\n"   // its own backend, below: fine
      "#include \"dtrain/backend/host/comm.hpp\"\n"     // the host backend, same layer: fine
      "#include \"dtrain/backend/cuda/offload.hpp\"\n"  // its own backend, above: reported
      "#include \"dtrain/backend/rocm/device.hpp\"\n"   // another backend: reported
      "#include \"dtrain/backend/backends.hpp\"\n";     // the umbrella's list: reported
  const std::string fake = "backend/cuda/comm_fake.hpp";
  const auto bad = bad_includes(fake, place_of(fake), text, order, seen);
  BOOST_TEST_REQUIRE(bad.size() == 3u);
  BOOST_TEST(bad[0].where == "dtrain/backend/cuda/comm_fake.hpp:4");
  BOOST_TEST(bad[1].where == "dtrain/backend/cuda/comm_fake.hpp:5");
  BOOST_TEST(bad[2].where == "dtrain/backend/cuda/comm_fake.hpp:6");
  // The host backend reaches no other backend; a generic header none at all.
  BOOST_TEST(bad_includes("backend/host/train_x.hpp", place_of("backend/host/train_x.hpp"),
                          "#include \"dtrain/backend/cuda/device.hpp\"\n", order, seen)
                 .size() == 1u);
  BOOST_TEST(bad_includes("offload/x.hpp", place_of("offload/x.hpp"), "#include \"dtrain/backend/host/device.hpp\"\n",
                          order, seen)
                 .size() == 1u);
  const std::map<std::string, std::vector<std::string>> folders{{"host", {"device.hpp", "train_instances.hpp"}},
                                                                {"rocm", {"device.hpp"}}};
  BOOST_TEST(backends_without_instances(folders) == std::vector<std::string>{"rocm"});
}

// The test of include/dtrain/<layer>/x.hpp is found under tests/<layer>/.
BOOST_AUTO_TEST_CASE(every_layer_has_a_test_folder) {
  for (const auto& e : fs::directory_iterator(repo / "include/dtrain"))
    if (e.is_directory() && e.path().filename() != backend_dir)
      BOOST_TEST(fs::is_directory(repo / "tests" / e.path().filename()),
                 "include/dtrain/" << e.path().filename().string() << "/ has no tests/" << e.path().filename().string()
                                   << "/ folder");
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
