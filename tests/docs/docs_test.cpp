// The documentation, checked like code:
//   - every C++ block in README.md and docs/ is preceded by
//     <!-- snippet: PATH#NAME --> and equals the region of PATH between
//     `// [snippet:NAME]` and `// [/snippet:NAME]` (dedented); PATH is a file
//     the build compiles (docs/snippets/*.cpp, the examples, the tests), and
//     every region of docs/snippets is shown somewhere;
//   - every text block preceded by <!-- output: ID --> (the error texts of
//     docs/troubleshooting.md and docs/guide.md) is what dtrain prints in
//     scenario ID, which this test produces for real: each line of the block
//     must match a line of the output, where {...} stands for any text (pids,
//     ports, paths, source lines);
//   - every relative link of README.md and docs/ points to a file of the
//     repository and, with #id, to a heading of that page;
//   - no file of the repository cites notes it does not hold (the DESIGN,
//     TOOLCHAIN and STYLE .md files, or a shared/ folder outside it);
//   - the API reference (scripts/api_reference.sh) builds without a warning.
#define BOOST_TEST_MODULE docs
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "examples/run_example.hpp"
#include "launch/process.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/policy/strategy.hpp>

namespace fs = std::filesystem;
using dtrain::test::Finished;
using dtrain::test::Process;

namespace {

const fs::path repo = DTRAIN_SOURCE_DIR;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "cannot read " << p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string line; std::getline(s, line);) out.push_back(line);
  return out;
}

std::string rtrim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.pop_back();
  return s;
}

// A fenced block of a page, with the marker comment above it (if any).
struct Block {
  fs::path page;
  int line = 0;        // the opening fence's line, from 1
  std::string lang;    // the fence's info string
  std::string marker;  // "snippet: ..." / "output: ...", or empty
  std::vector<std::string> body;
};

std::string ltrim(const std::string& s) { return s.substr(std::min(s.find_first_not_of(" \t"), s.size())); }

// Fences may be indented (a block inside a list item): the body loses the
// fence's indentation.
std::vector<Block> blocks_of(const fs::path& page) {
  const auto lines = lines_of(slurp(page));
  std::vector<Block> out;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (ltrim(lines[i]).rfind("```", 0) != 0) continue;
    const std::size_t indent = lines[i].size() - ltrim(lines[i]).size();
    Block b{page, static_cast<int>(i + 1), rtrim(ltrim(lines[i]).substr(3)), "", {}};
    for (std::size_t k = i; k-- > 0;) {  // the nearest non-blank line above
      if (rtrim(lines[k]).empty()) continue;
      static const std::regex marker(R"(^<!--\s*(.*?)\s*-->$)");
      std::smatch m;
      const std::string above = rtrim(ltrim(lines[k]));
      if (std::regex_match(above, m, marker)) b.marker = m[1];
      break;
    }
    std::size_t j = i + 1;
    for (; j < lines.size() && ltrim(lines[j]).rfind("```", 0) != 0; ++j)
      b.body.push_back(rtrim(lines[j].substr(std::min(indent, lines[j].find_first_not_of(' ') == std::string::npos
                                                                  ? lines[j].size()
                                                                  : lines[j].find_first_not_of(' ')))));
    BOOST_REQUIRE_MESSAGE(j < lines.size(), page << ":" << b.line << ": a code block that is never closed");
    out.push_back(std::move(b));
    i = j;
  }
  return out;
}

std::vector<fs::path> pages() {
  std::vector<fs::path> out{repo / "README.md"};
  for (const auto& e : fs::recursive_directory_iterator(repo / "docs"))
    if (e.is_regular_file() && e.path().extension() == ".md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The lines between `// [snippet:NAME]` and `// [/snippet:NAME]` of `file`,
// with their common indentation removed; empty optional if absent.
std::optional<std::vector<std::string>> region(const fs::path& file, const std::string& name) {
  const auto lines = lines_of(slurp(file));
  const std::string open = "// [snippet:" + name + "]", close = "// [/snippet:" + name + "]";
  auto trimmed = [](const std::string& s) { return rtrim(ltrim(s)); };
  auto begin = std::find_if(lines.begin(), lines.end(), [&](const std::string& l) { return trimmed(l) == open; });
  if (begin == lines.end()) return std::nullopt;
  auto end = std::find_if(begin + 1, lines.end(), [&](const std::string& l) { return trimmed(l) == close; });
  if (end == lines.end()) return std::nullopt;
  std::vector<std::string> body(begin + 1, end);
  std::size_t indent = std::string::npos;
  for (const auto& l : body)
    if (!rtrim(l).empty()) indent = std::min(indent, l.find_first_not_of(' '));
  for (auto& l : body) l = rtrim(l).empty() ? "" : rtrim(l.substr(indent));
  return body;
}

// Every `[snippet:NAME]` region defined in `file`.
std::set<std::string> regions_in(const fs::path& file) {
  std::set<std::string> out;
  static const std::regex open(R"(//\s*\[snippet:([A-Za-z0-9_]+)\])");
  const std::string text = slurp(file);
  for (std::sregex_iterator it(text.begin(), text.end(), open), end; it != end; ++it) out.insert((*it)[1]);
  return out;
}

// `pattern` (a documented line, {...} = any text) against an output line.
bool line_matches(const std::string& pattern, const std::string& line) {
  std::string re;
  for (std::size_t i = 0; i < pattern.size();) {
    if (pattern.compare(i, 5, "{...}") == 0) {
      re += ".*";
      i += 5;
      continue;
    }
    const char c = pattern[i++];
    if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) re += '\\';
    re += c;
  }
  return std::regex_match(rtrim(line), std::regex(re));
}

// ---- the scenarios whose output the pages quote -----------------------------

std::string mlp_config() { return (repo / "examples/configs/ddp_host.yaml").string(); }

std::vector<std::string> launch_mlp(const std::vector<std::string>& extra) {
  std::vector<std::string> args{
      DTRAIN_RUN_PATH, "--nproc-per-node", "2",         "--master-port", std::to_string(dtrain::test::free_port()),
      TRAIN_MLP_PATH,  "--config",         mlp_config()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The pid of the process whose parent is `parent` and whose environment holds `var`.
pid_t child_with(pid_t parent, const std::string& var) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string stat_text;
    std::getline(stat, stat_text);
    const auto close = stat_text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat_text.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::ifstream env(e.path() / "environ", std::ios::binary);
    for (std::string entry; std::getline(env, entry, '\0');)
      if (entry == var) return static_cast<pid_t>(std::stoi(name));
  }
  return 0;
}

using Scenario = std::function<std::string(const fs::path& dir)>;

const std::map<std::string, Scenario>& scenarios() {
  static const std::map<std::string, Scenario> all{
      // Parameter shards offloaded under a strategy that replicates them.
      {"offload_params_with_ddp",
       [](const fs::path&) {
         const Finished f = dtrain::test::run(launch_mlp({"steps=2", "strategy=ddp", "offload=params"}));
         BOOST_TEST(f.exited_with(2));
         return f.out + f.err;
       }},
      // The optimizer state sent to a directory that does not exist.
      {"offload_dir_missing",
       [](const fs::path&) {
         const Finished f = dtrain::test::run(launch_mlp({"steps=2", "offload=nvme:/nonexistent/dtrain-state"}));
         BOOST_TEST(f.exited_with(2));
         return f.out + f.err;
       }},
      // Rank 1 gets SIGUSR1 (a scheduler's notice) in its 5th forward: every
      // rank saves after the agreed step and the job exits with 75.
      {"preempted",
       [](const fs::path& dir) {
         const Finished f =
             dtrain::test::run(launch_mlp({"steps=50", "log_every=1000", "checkpoint_dir=" + (dir / "ck").string()}),
                               {{"DTRAIN_FAULT_INJECT", std::string("forward:1:5:USR1")}});
         BOOST_TEST(f.exited_with(75));
         return f.out + f.err;
       }},
      // The checkpoint at step 2 meets a file-size limit (ulimit -f, as a
      // full disk would): every rank fails with the bytes and the free space.
      {"save_file_too_large",
       [](const fs::path& dir) {
         std::vector<std::string> args{"/bin/sh", "-c", "ulimit -f 8; trap '' XFSZ; exec \"$@\"", "sh"};
         for (auto& a :
              launch_mlp({"steps=4", "save_every=2", "log_every=1000", "checkpoint_dir=" + (dir / "ck").string()}))
           args.push_back(std::move(a));
         const Finished f = dtrain::test::run(args);
         BOOST_TEST(f.exited_with(1));
         BOOST_TEST(!fs::exists(dir / "ck" / "step-00000002"), "the failed save left its files");
         return f.out + f.err;
       }},
      // A key the example does not know: a usage error, exit status 2.
      {"unknown_key",
       [](const fs::path&) {
         const Finished f = dtrain::test::run({TRAIN_MLP_PATH, "stepz=3"});
         BOOST_TEST(f.exited_with(2));
         return f.out + f.err;
       }},
      // Rank 1 stops (SIGSTOP) in the middle of training: it is alive but
      // never reaches the next all-reduce, so rank 0's times out.
      {"collective_timeout",
       [](const fs::path&) {
         Process job(launch_mlp({"steps=1000000", "log_every=100000", "timeout_s=2"}));
         pid_t rank1 = 0;
         BOOST_REQUIRE(dtrain::test::wait_until([&] { return (rank1 = child_with(job.pid(), "RANK=1")) != 0; }));
         std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // into the training steps
         ::kill(rank1, SIGSTOP);
         const Finished f = job.wait(60);
         BOOST_TEST(f.exited_with(1));
         return f.out + f.err;
       }},
      // Rank 1 is killed with SIGKILL in its third backward.
      {"rank_killed",
       [](const fs::path&) {
         const Finished f =
             dtrain::test::run(launch_mlp({"steps=20"}), {{"DTRAIN_FAULT_INJECT", std::string("backward:1:3")}});
         BOOST_TEST(f.exited_with(137));
         return f.out + f.err;
       }},
      // Another process holds the master port.
      {"port_in_use",
       [](const fs::path&) {
         const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
         sockaddr_in addr{};
         addr.sin_family = AF_INET;
         addr.sin_addr.s_addr = htonl(INADDR_ANY);
         addr.sin_port = 0;
         BOOST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(fd, 1) == 0);
         socklen_t len = sizeof addr;
         ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
         const std::string port = std::to_string(ntohs(addr.sin_port));
         const Finished f = dtrain::test::run(
             {DTRAIN_RUN_PATH, "--nproc-per-node", "2", "--master-port", port, TRAIN_MLP_PATH, "steps=2"});
         ::close(fd);
         BOOST_TEST(f.exited_with(1));
         return f.out + f.err;
       }},
      // Two ranks started by hand with different models.
      {"models_differ",
       [](const fs::path&) {
         const std::string port = std::to_string(dtrain::test::free_port());
         std::vector<std::unique_ptr<Process>> ranks;
         for (const char* r : {"0", "1"})
           ranks.push_back(std::make_unique<Process>(
               std::vector<std::string>{TRAIN_MLP_PATH, "steps=2",
                                        std::string("hidden=64,") + (r[0] == '0' ? "64" : "32")},
               dtrain::test::EnvChanges{{"RANK", std::string(r)},
                                        {"LOCAL_RANK", std::string(r)},
                                        {"WORLD_SIZE", std::string("2")},
                                        {"LOCAL_WORLD_SIZE", std::string("2")},
                                        {"MASTER_ADDR", std::string("127.0.0.1")},
                                        {"DTRAIN_JOB_TOKEN", std::string("docs-test-job-token-0123456789abcdef")},
                                        {"MASTER_PORT", port}}));
         std::string out;
         for (auto& r : ranks) {
           const Finished f = r->wait(60);
           BOOST_TEST(f.exited_with(2));  // a configuration error
           out += f.out + f.err;
         }
         return out;
       }},
      // A byte of the newest checkpoint's shard flipped; resume=latest skips
      // it for the one before, an explicit resume of it fails.
      {"corrupt_checkpoint",
       [](const fs::path& dir) {
         const std::string ck = (dir / "ck").string();
         const Finished first = dtrain::test::run(launch_mlp({"steps=6", "save_every=3", "checkpoint_dir=" + ck}));
         BOOST_REQUIRE(first.exited_with(0));
         const fs::path shard = fs::path(ck) / "step-00000006" / "shard-00000-of-00002.safetensors";
         {
           std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
           f.seekg(-10, std::ios::end);
           char c = 0;
           f.get(c);
           f.seekp(-10, std::ios::end);
           f.put(static_cast<char>(c ^ 0x5a));
         }
         const Finished latest =
             dtrain::test::run(launch_mlp({"steps=9", "checkpoint_dir=" + ck, "save_every=100", "resume=latest"}));
         BOOST_TEST(latest.exited_with(0));
         const Finished named = dtrain::test::run(
             launch_mlp({"steps=9", "checkpoint_dir=" + ck, "resume=" + (fs::path(ck) / "step-00000006").string()}));
         BOOST_TEST(named.exited_with(1));
         return latest.out + latest.err + named.out + named.err;
       }},
      // A model too large for the memory the process may use. Two OpenBLAS
      // threads, whatever the cores: see blas_pool_too_large.
      {"host_out_of_memory",
       [](const fs::path&) {
         const Finished f = dtrain::test::run({"/bin/sh", "-c",
                                               std::string("ulimit -v 3000000 && OPENBLAS_NUM_THREADS=2 exec ") +
                                                   TRAIN_MLP_PATH + " steps=2 hidden=16384,16384"});
         BOOST_TEST(f.exited_with(1));
         return f.out + f.err;
       }},
      // The same limit on a 16-core machine (many_cores.cpp shows OpenBLAS 16
      // cores): OpenBLAS's pool of 16 threads reserves 2 GiB of it as it
      // loads, some threads find no room and wait forever. dtrain reports it,
      // and train_mlp ends without waiting for them.
      {"blas_pool_too_large",
       [](const fs::path&) {
         const Finished f = dtrain::test::run({"/bin/sh", "-c",
                                               std::string("ulimit -v 3000000 && LD_PRELOAD=") + MANY_CORES_PATH +
                                                   " exec " + TRAIN_MLP_PATH + " steps=2"});
         BOOST_TEST(f.exited_with(2));
         return f.out + f.err;
       }},
  };
  return all;
}

// The id GitHub gives a heading: lower case, spaces to '-', ASCII
// punctuation but '-' and '_' dropped (no page has a non-ASCII heading).
std::string heading_id(const std::string& heading) {
  std::string id;
  for (const unsigned char c : heading) {
    if (c == ' ')
      id += '-';
    else if (std::isalnum(c) || c == '-' || c == '_' || c >= 0x80)
      id += static_cast<char>(std::tolower(c));
  }
  return id;
}

// A page's lines outside its fenced code blocks, with their numbers (from 1).
std::vector<std::pair<int, std::string>> prose_lines(const fs::path& page) {
  std::vector<std::pair<int, std::string>> out;
  bool fenced = false;
  int number = 0;
  for (const auto& line : lines_of(slurp(page))) {
    ++number;
    if (ltrim(line).rfind("```", 0) == 0)
      fenced = !fenced;
    else if (!fenced)
      out.emplace_back(number, line);
  }
  return out;
}

// The ids of a page's headings; a repeated heading gets -1, -2, ... as on GitHub.
std::set<std::string> heading_ids(const fs::path& page) {
  static const std::regex heading(R"(^#{1,6}\s+(.*?)\s*#*\s*$)");
  std::set<std::string> out;
  std::map<std::string, int> seen;
  for (const auto& [number, line] : prose_lines(page)) {
    std::smatch m;
    if (!std::regex_match(line, m, heading)) continue;
    const std::string id = heading_id(m[1]);
    const int n = seen[id]++;
    out.insert(n == 0 ? id : id + "-" + std::to_string(n));
  }
  return out;
}
}  // namespace

// The strategy table of docs/policies.md lists every built-in strategy
// (dtrain::builtin_strategies, the one list the examples and dtrain-estimate
// read too) by its config name.
BOOST_AUTO_TEST_CASE(the_strategy_table_lists_every_builtin_strategy) {
  const std::string page = slurp(repo / "docs/policies.md");
  std::vector<std::string> names;
  []<class... Kind>(std::type_identity<std::tuple<Kind...>>, std::vector<std::string>& out) {
    (out.emplace_back(Kind::name), ...);
  }(std::type_identity<dtrain::builtin_strategies>{}, names);
  int listed = 0;
  for (const auto& name : names) {
    const bool row = page.find("| `" + name + "` |") != std::string::npos;
    listed += row ? 1 : 0;
    BOOST_TEST(row, "docs/policies.md's strategy table has no row for " << name);
  }
  BOOST_TEST(listed == static_cast<int>(std::tuple_size_v<dtrain::builtin_strategies>));
}

// Links are checked outside code blocks and code spans: [text](target) whose
// target has no scheme (http:, mailto:) is a path from the page's folder,
// with an optional #id of a heading of the target page (or of this page).
BOOST_AUTO_TEST_CASE(every_relative_link_points_to_a_file_and_heading_that_exist) {
  static const std::regex link(R"(\]\(([^)\s]+)(\s+"[^"]*")?\))");
  static const std::regex code_span("`[^`]*`");
  static const std::regex scheme("^[A-Za-z][A-Za-z0-9+.-]*:");
  int checked = 0;
  for (const auto& page : pages())
    for (const auto& [number, raw] : prose_lines(page)) {
      const std::string line = std::regex_replace(raw, code_span, "");
      for (std::sregex_iterator it(line.begin(), line.end(), link), end; it != end; ++it) {
        const std::string target = (*it)[1];
        if (std::regex_search(target, scheme)) continue;
        const auto hash = target.find('#');
        const std::string path = target.substr(0, hash);
        const fs::path file = path.empty() ? page : (page.parent_path() / path).lexically_normal();
        BOOST_TEST_CONTEXT(fs::relative(page, repo).string() << ":" << number << ": " << target) {
          ++checked;
          BOOST_TEST(fs::exists(file), "the link points to " << file << ", which does not exist");
          if (hash != std::string::npos && file.extension() == ".md" && fs::is_regular_file(file)) {
            const std::string id = target.substr(hash + 1);
            BOOST_TEST(heading_ids(file).count(id) == 1, fs::relative(file, repo).string()
                                                             << " has no heading #" << id);
          }
        }
      }
    }
  BOOST_TEST(checked >= 100);
  BOOST_TEST_MESSAGE(checked << " relative links point to existing files and headings");
}

// The repository's text files cite only what the repository holds. The
// names are assembled here so that this file does not contain them.
BOOST_AUTO_TEST_CASE(no_file_cites_notes_the_repository_does_not_hold) {
  const std::vector<std::string> absent{std::string("DESIGN") + ".md", std::string("TOOLCHAIN") + ".md",
                                        std::string("STYLE") + ".md", std::string("../") + "shared/"};
  const std::set<std::string> text{".md", ".hpp",   ".cpp", ".h",  ".cu",   ".cuh", ".py",
                                   ".sh", ".cmake", ".txt", ".in", ".yaml", ".supp"};
  std::vector<fs::path> files{repo / "README.md", repo / "CHANGELOG.md", repo / "CMakeLists.txt",
                              repo / "conanfile.py"};
  for (const char* root :
       {"docs", "include", "examples", "tests", "scripts", "tools", "cmake", "bench", "ports", "test_package"}) {
    if (!fs::is_directory(repo / root)) continue;
    for (auto it = fs::recursive_directory_iterator(repo / root); it != fs::recursive_directory_iterator(); ++it) {
      const auto& name = it->path().filename().string();
      // Fuzz inputs are arbitrary bytes; results are data.
      if (it->is_directory() && (name == "corpus" || name == "results" || name == "build"))
        it.disable_recursion_pending();
      else if (it->is_regular_file() && text.count(it->path().extension().string()))
        files.push_back(it->path());
    }
  }
  int checked = 0;
  for (const auto& file : files) {
    if (!fs::is_regular_file(file)) continue;
    ++checked;
    int number = 0;
    for (const auto& line : lines_of(slurp(file))) {
      ++number;
      for (const auto& name : absent)
        BOOST_TEST(line.find(name) == std::string::npos,
                   fs::relative(file, repo).string() << ":" << number << " cites " << name
                                                     << ", which the repository does not hold: state the fact instead");
    }
  }
  BOOST_TEST(checked >= 100);
}

BOOST_AUTO_TEST_CASE(every_cpp_block_is_a_region_of_a_compiled_source) {
  std::set<std::string> shown;  // "path#name"
  int checked = 0;
  for (const auto& page : pages())
    for (const Block& b : blocks_of(page)) {
      if (b.lang != "cpp" && b.lang != "c++") continue;
      const std::string where = fs::relative(page, repo).string() + ":" + std::to_string(b.line);
      BOOST_TEST_CONTEXT(where) {
        BOOST_TEST_REQUIRE(b.marker.rfind("snippet:", 0) == 0,
                           "a C++ block needs <!-- snippet: PATH#NAME --> above it, naming the compiled source it "
                           "comes from");
        const std::string ref = b.marker.substr(b.marker.find_first_not_of(' ', 8));
        const auto hash = ref.find('#');
        BOOST_TEST_REQUIRE(hash != std::string::npos, "'" << ref << "' is not PATH#NAME");
        const fs::path file = repo / ref.substr(0, hash);
        BOOST_TEST_REQUIRE(fs::exists(file), file << " does not exist");
        const auto code = region(file, ref.substr(hash + 1));
        BOOST_TEST_REQUIRE(code.has_value(), "no region [snippet:" << ref.substr(hash + 1) << "] in " << file);
        // The first difference, shown as both lines.
        const auto& doc = b.body;
        std::size_t i = 0;
        while (i < doc.size() && i < code->size() && doc[i] == (*code)[i]) ++i;
        BOOST_TEST((i == doc.size() && i == code->size()),
                   "the block differs from " << ref << " at its line " << i + 1
                                             << ":\n  page:   " << (i < doc.size() ? doc[i] : "<end>")
                                             << "\n  source: " << (i < code->size() ? (*code)[i] : "<end>"));
        shown.insert(ref);
        ++checked;
      }
    }
  BOOST_TEST(checked >= 20);
  // Every region written for the docs is shown on some page.
  for (const auto& e : fs::directory_iterator(repo / "docs/snippets"))
    if (e.path().extension() == ".cpp")
      for (const auto& name : regions_in(e.path())) {
        const std::string ref = "docs/snippets/" + e.path().filename().string() + "#" + name;
        BOOST_TEST(shown.count(ref) == 1, ref << " is shown on no page");
      }
  BOOST_TEST_MESSAGE(checked << " C++ blocks match their compiled sources");
}

// A block marked <!-- file: PATH --> shows that whole file (the examples'
// Slurm batch scripts, which tests/launch/slurm_test.sh runs through a real
// Slurm), line for line.
BOOST_AUTO_TEST_CASE(every_file_block_is_the_whole_file) {
  int checked = 0;
  for (const auto& page : pages())
    for (const Block& b : blocks_of(page)) {
      if (b.marker.rfind("file:", 0) != 0) continue;
      const std::string where = fs::relative(page, repo).string() + ":" + std::to_string(b.line);
      BOOST_TEST_CONTEXT(where) {
        const fs::path file = repo / b.marker.substr(b.marker.find_first_not_of(' ', 5));
        BOOST_TEST_REQUIRE(fs::exists(file), file << " does not exist");
        std::vector<std::string> lines = lines_of(slurp(file));
        for (auto& l : lines) l = rtrim(l);
        while (!lines.empty() && lines.back().empty()) lines.pop_back();
        std::size_t i = 0;
        while (i < b.body.size() && i < lines.size() && b.body[i] == lines[i]) ++i;
        BOOST_TEST((i == b.body.size() && i == lines.size()),
                   "the block differs from " << file << " at its line " << i + 1
                                             << ":\n  page: " << (i < b.body.size() ? b.body[i] : "<end>")
                                             << "\n  file: " << (i < lines.size() ? lines[i] : "<end>"));
        ++checked;
      }
    }
  BOOST_TEST(checked >= 2);
}

BOOST_AUTO_TEST_CASE(quoted_outputs_are_what_dtrain_prints) {
  std::map<std::string, std::string> produced;  // scenario -> output, run once
  std::set<std::string> quoted;
  int checked = 0;
  for (const auto& page : pages())
    for (const Block& b : blocks_of(page)) {
      if (b.marker.rfind("output:", 0) != 0) continue;
      const std::string id = b.marker.substr(b.marker.find_first_not_of(' ', 7));
      const std::string where = fs::relative(page, repo).string() + ":" + std::to_string(b.line);
      BOOST_TEST_CONTEXT(where << " (output: " << id << ")") {
        const auto it = scenarios().find(id);
        BOOST_TEST_REQUIRE((it != scenarios().end()), "no scenario '" << id << "' in tests/docs/docs_test.cpp");
        quoted.insert(id);
        if ((id == "host_out_of_memory" || id == "blas_pool_too_large") && dtrain::test::sanitizer_shadow) {
          // A sanitizer reserves terabytes of shadow address space as the
          // process starts, which `ulimit -v` forbids: it dies before dtrain runs.
          BOOST_TEST_MESSAGE(where << ": not run in a sanitizer build (ulimit -v leaves no room for its "
                                      "shadow memory); the default build runs it");
          continue;
        }
        if (!produced.count(id)) {
          const fs::path dir = dtrain::test::fresh("scenario_" + id);
          fs::create_directories(dir);
          produced[id] = it->second(dir);
        }
        const auto out = lines_of(produced[id]);
        for (const auto& want : b.body) {
          if (want.empty()) continue;
          const bool found =
              std::any_of(out.begin(), out.end(), [&](const std::string& l) { return line_matches(want, l); });
          BOOST_TEST(found, "dtrain does not print the documented line\n  " << want << "\nits output was:\n"
                                                                            << produced[id]);
        }
        ++checked;
      }
    }
  BOOST_TEST(checked >= 5);
  for (const auto& [id, scenario] : scenarios())
    BOOST_TEST(quoted.count(id) == 1, "scenario " << id << " is quoted on no page");
}

BOOST_AUTO_TEST_CASE(the_api_reference_builds_without_warnings) {
  BOOST_TEST_REQUIRE(std::system("command -v doxygen > /dev/null") == 0,
                     "doxygen is not installed: run scripts/setup.sh (or apt-get install doxygen)");
  const fs::path out = fs::path(DTRAIN_TEST_BINARY_DIR) / "api";
  fs::remove_all(out);
  fs::create_directories(out);
  const Finished f = dtrain::test::run({(repo / "scripts/api_reference.sh").string(), out.string()});
  BOOST_TEST(f.exited_with(0), "doxygen failed:\n" << f.out << f.err);
  const std::string warnings = slurp(out / "warnings.log");
  BOOST_TEST(warnings.empty(), "doxygen warned:\n" << warnings);
  // The reference has the Trainer, its step() and the communicator.
  const fs::path trainer = out / "html" / "classdtrain_1_1Trainer.html";
  BOOST_TEST_REQUIRE(fs::exists(trainer));
  BOOST_TEST(slurp(trainer).find("step") != std::string::npos);
  BOOST_TEST(fs::exists(out / "html" / "index.html"));
}
