// Metrics where users look, checked with the programs users read them with.
//
//   tensorboard_test   TensorBoardWriter's files, and train_mlp's
//                      tensorboard=DIR against its metrics= JSONL, read back
//                      by TensorBoard itself (PyPI, in a venv under this
//                      test's build folder; tests/metrics/read_events.py).
//   plot_metrics_test  scripts/plot_metrics.py on a train_mlp run and on the
//                      strategy benchmark's JSON (Debian's matplotlib).
//
// One program, one Boost.Test suite per CTest entry (the first argument names
// it), so that each entry is skipped (exit 77) on its own: the first only when
// pip cannot install tensorboard (no network), the second only when
// /usr/bin/python3 has no matplotlib.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "examples/run_example.hpp"
#include "strategy/common.hpp"
#include "support/python_venv.hpp"
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include <dtrain/checkpoint/checkpoint.hpp>
#include <dtrain/metrics/tensorboard.hpp>

namespace fs = std::filesystem;
using dtrain::test::fresh;
using dtrain::test::read_file;
using dtrain::test::scratch;
using nlohmann::json;

namespace {

const fs::path venv = fs::path(DTRAIN_TEST_BINARY_DIR) / "venv";
// TensorBoard and its dependencies, pinned: every run installs the same packages.
const char* const tensorboard_pin =
    "tensorboard==2.21.0 tensorboard-data-server==0.7.2 absl-py==2.5.1 grpcio==1.85.3 Markdown==3.11.3 "
    "MarkupSafe==3.0.4 protobuf==7.36.2 typing_extensions==4.16.0 Werkzeug==3.1.9";
const std::string source_dir = DTRAIN_SOURCE_DIR;
const std::string plot_script = source_dir + "/scripts/plot_metrics.py";

int shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What TensorBoard reads from `dir` (see read_events.py for the two views).
json read_events(const fs::path& dir) {
  const auto out = scratch("events.json"), err = scratch("read_events.log");
  const int status = shell((venv / "bin/python").string() + " " + source_dir + "/tests/metrics/read_events.py " +
                           dir.string() + " > " + out.string() + " 2> " + err.string());
  BOOST_REQUIRE_MESSAGE(status == 0, "read_events.py failed: " << read_file(err));
  return json::parse(read_file(out));
}

// Every record of `file` read as one whole: both CRCs of each record checked
// (TensorBoard's reader stops quietly at the first bad one, so a file read
// only in part shows here).
void require_whole(const json& file) {
  BOOST_TEST_INFO(file.at("name").get<std::string>());
  BOOST_REQUIRE_EQUAL(file.at("record_bytes").get<std::int64_t>(), file.at("bytes").get<std::int64_t>());
}

// A random non-zero, finite value and the float32 TensorBoard must hold for
// it. Half are float32 bit patterns over every exponent (passed exactly), half
// doubles of any magnitude a metric has (rounded to nearest once).
std::pair<double, float> random_value(std::mt19937_64& rng) {
  if (rng() % 2 == 0) {
    const std::uint32_t sign = static_cast<std::uint32_t>(rng() % 2) << 31;
    const std::uint32_t exponent = static_cast<std::uint32_t>(1 + rng() % 254) << 23;
    const std::uint32_t mantissa = static_cast<std::uint32_t>(rng()) & 0x7fffffu;
    const float f = std::bit_cast<float>(sign | exponent | mantissa);
    return {f, f};
  }
  std::normal_distribution<double> normal;
  double v = 0;
  while (v == 0) v = normal(rng) * std::pow(10.0, static_cast<double>(rng() % 17) - 8);
  return {v, static_cast<float>(v)};
}

struct WrittenEvent {
  std::int64_t step;
  std::vector<std::pair<std::string, float>> values;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(tensorboard)

BOOST_AUTO_TEST_CASE(random_scalars_read_back_exactly) {
  const auto dir = fresh("random");
  const std::uint64_t seed = 20251124;
  std::mt19937_64 rng(seed);
  const std::vector<std::string> tags{"train/loss", "train/lr", "perf/step_ms",    "memory/params_bytes",
                                      "x",          "a/b/c",    "unicode/\xce\xbb"};
  std::vector<WrittenEvent> written;
  const double opened = unix_seconds();
  fs::path file;
  {
    dtrain::TensorBoardWriter tb(dir);
    file = tb.path();
    std::int64_t step = 0;
    for (int e = 0; e < 300; ++e) {
      std::vector<std::string> pick = tags;
      std::shuffle(pick.begin(), pick.end(), rng);
      pick.resize(1 + rng() % 4);
      WrittenEvent w{step, {}};
      std::vector<dtrain::TensorBoardScalar> values;
      for (const auto& tag : pick) {
        const auto [value, stored] = random_value(rng);
        values.push_back({tag, value});
        w.values.emplace_back(tag, stored);
      }
      tb.write_scalars(step, values);
      written.push_back(std::move(w));
      // Mostly small gaps, every tenth enormous: steps' varints of 1 to 8 bytes.
      step += 1 + static_cast<std::int64_t>(rng() % (e % 10 == 9 ? std::uint64_t{1} << 45 : 1000));
    }
  }
  const double closed = unix_seconds();
  BOOST_TEST(file.parent_path() == dir);
  BOOST_TEST(file.filename().string().starts_with("events.out.tfevents."));

  const json got = read_events(dir);
  BOOST_TEST_MESSAGE("seed " << seed << ": " << written.size() << " events in " << file.filename() << ", "
                             << fs::file_size(file) << " bytes");
  BOOST_REQUIRE_EQUAL(got.at("files").size(), 1u);
  const json& f = got.at("files")[0];
  BOOST_TEST(f.at("name").get<std::string>() == file.filename().string());
  require_whole(f);
  const json& events = f.at("events");
  BOOST_REQUIRE_EQUAL(events.size(), written.size() + 1);
  BOOST_TEST(events[0].at("kind").get<std::string>() == "file_version");
  BOOST_TEST(events[0].at("file_version").get<std::string>() == "brain.Event:2");
  double previous = 0;
  std::size_t checked = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    // Wall times come from the system clock while the writer was open; 1 ms
    // of slack for the double a Python float prints.
    const double t = events[i].at("wall_time").get<double>();
    BOOST_TEST(t >= opened - 1e-3);
    BOOST_TEST(t <= closed + 1e-3);
    BOOST_TEST(t >= previous);
    previous = t;
    if (i == 0) continue;
    const WrittenEvent& w = written[i - 1];
    BOOST_TEST_CONTEXT("event " << i << " at step " << w.step) {
      BOOST_TEST(events[i].at("kind").get<std::string>() == "summary");
      BOOST_TEST(events[i].at("step").get<std::int64_t>() == w.step);
      const json& values = events[i].at("values");
      BOOST_REQUIRE_EQUAL(values.size(), w.values.size());
      for (std::size_t k = 0; k < values.size(); ++k) {
        BOOST_TEST(values[k][0].get<std::string>() == w.values[k].first);
        // Exact: the float32 TensorBoard holds is the one the writer rounded to.
        BOOST_TEST(values[k][1].get<double>() == static_cast<double>(w.values[k].second));
        ++checked;
      }
    }
  }
  // The UI's view: each tag's points in the order written.
  std::map<std::string, std::vector<std::pair<std::int64_t, float>>> want;
  for (const auto& w : written)
    for (const auto& [tag, value] : w.values) want[tag].emplace_back(w.step, value);
  const json& scalars = got.at("scalars");
  BOOST_REQUIRE_EQUAL(scalars.size(), want.size());
  for (const auto& [tag, points] : want) {
    BOOST_TEST_CONTEXT("tag " << tag) {
      const json& p = scalars.at(tag);
      BOOST_REQUIRE_EQUAL(p.size(), points.size());
      for (std::size_t k = 0; k < points.size(); ++k) {
        BOOST_TEST(p[k][0].get<std::int64_t>() == points[k].first);
        BOOST_TEST(p[k][1].get<double>() == static_cast<double>(points[k].second));
      }
    }
  }
  BOOST_TEST_MESSAGE(checked << " values equal as float32, in the records and in the UI's view");
}

BOOST_AUTO_TEST_CASE(values_beyond_float_range_become_infinities) {
  using dtrain::detail::to_float32;
  const float inf = std::numeric_limits<float>::infinity(), max = std::numeric_limits<float>::max();
  BOOST_TEST(to_float32(1e300) == inf);
  BOOST_TEST(to_float32(-1e300) == -inf);
  BOOST_TEST(to_float32(static_cast<double>(max)) == max);
  BOOST_TEST(to_float32(-static_cast<double>(max)) == -max);
  BOOST_TEST(std::isnan(to_float32(std::nan(""))));
}

// Two writers in one folder within the same second: two files, the second
// named after the first; its session start at step 4 makes TensorBoard drop
// the first file's steps 4 and later (what a resumed job repeats).
BOOST_AUTO_TEST_CASE(a_second_run_in_the_folder_replaces_the_steps_it_repeats) {
  const auto dir = fresh("restart");
  fs::path first, second;
  {
    dtrain::TensorBoardWriter tb(dir);
    first = tb.path();
    tb.write_session_start(1);
    for (int s = 1; s <= 6; ++s) tb.write_scalar("train/loss", 100 + s, s);
  }
  {
    dtrain::TensorBoardWriter tb(dir);
    second = tb.path();
    tb.write_session_start(4);
    for (int s = 4; s <= 8; ++s) tb.write_scalars(s, {{"train/loss", 200.0 + s}, {"train/lr", 0.5}});
  }
  BOOST_TEST(first != second);
  BOOST_TEST(first.filename().string() < second.filename().string());  // TensorBoard reads files in name order
  const json got = read_events(dir);
  BOOST_REQUIRE_EQUAL(got.at("files").size(), 2u);
  for (const auto& f : got.at("files")) require_whole(f);
  const json& session = got.at("files")[1].at("events")[1];
  BOOST_TEST(session.at("kind").get<std::string>() == "session_log");
  BOOST_TEST(session.at("session_status").get<int>() == 1);  // START
  BOOST_TEST(session.at("step").get<int>() == 4);
  const json want_loss =
      json::array({{1, 101.0}, {2, 102.0}, {3, 103.0}, {4, 204.0}, {5, 205.0}, {6, 206.0}, {7, 207.0}, {8, 208.0}});
  BOOST_TEST(got.at("scalars").at("train/loss") == want_loss, got.at("scalars").dump());
  BOOST_TEST(got.at("scalars").at("train/lr").size() == 5u);
}

BOOST_AUTO_TEST_CASE(an_unusable_folder_or_tag_is_an_error_naming_it) {
  const auto blocker = fresh("a_file");
  std::ofstream(blocker) << "not a folder";
  const auto dir = blocker / "tb";
  BOOST_CHECK_EXCEPTION(dtrain::TensorBoardWriter{dir}, dtrain::error, [&](const dtrain::error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return e.problem().find(dir.string()) != std::string::npos && !e.fix().empty();
  });
  dtrain::TensorBoardWriter tb(fresh("empty_tag"));
  BOOST_CHECK_EXCEPTION(tb.write_scalar("", 1.0, 3), dtrain::error, [&](const dtrain::error& e) {
    return e.problem().find("empty tag") != std::string::npos &&
           e.problem().find(tb.path().string()) != std::string::npos;
  });
}

// A hand-written loop over a Trainer on 2 ranks (threads), as docs/metrics.md
// shows it: rank 0's StepStats, read back exactly as float32.
BOOST_AUTO_TEST_CASE(a_hand_written_loop_logs_the_trainers_stats) {
  using namespace dtrain;
  const auto dir = fresh("own_loop");
  const int steps = 12;
  std::vector<StepStats> logged;
  testing::run_ranks(2, [&](World& world) {
    testing::UnevenNet model;
    Trainer<testing::UnevenNet, Device<Host>, Strategy<DDP>> real(world, model, AdamW{.lr = 1e-2f}, {.seed = 5});
    auto next_micro_batches = [&, k = 0]() mutable { return testing::micro_batches(k++, world.rank(), {7}); };
    // `trainer` steps the Trainer and keeps rank 0's stats for the checks
    // below, so that the region shows the calls a user's loop makes.
    struct {
      decltype(real)& t;
      std::vector<StepStats>* log;
      StepStats step(std::span<const Batch> micro) {
        const StepStats s = t.step(micro);
        if (t.world().rank() == 0) log->push_back(s);
        return s;
      }
    } trainer{real, &logged};
    // [snippet:tensorboard_loop]
    std::optional<dtrain::TensorBoardWriter> tb;  // rank 0 writes, the other ranks hold none
    if (world.rank() == 0) tb.emplace(dir);       // dir/events.out.tfevents.<seconds>.<host>
    for (int step = 0; step < steps; ++step) {
      const dtrain::StepStats s = trainer.step(next_micro_batches());
      if (tb) tb->write_scalars(s.step, {{"train/loss", s.loss}, {"train/lr", s.lr}, {"train/grad_norm", s.grad_norm}});
    }
    // [/snippet:tensorboard_loop]
  });
  const json got = read_events(dir);
  BOOST_REQUIRE_EQUAL(got.at("files").size(), 1u);
  require_whole(got.at("files")[0]);
  const json& scalars = got.at("scalars");
  BOOST_REQUIRE_EQUAL(scalars.size(), 3u);
  BOOST_REQUIRE_EQUAL(logged.size(), static_cast<std::size_t>(steps));
  for (const std::string tag : {"train/loss", "train/lr", "train/grad_norm"}) {
    const json& points = scalars.at(tag);
    BOOST_REQUIRE_EQUAL(points.size(), logged.size());
    for (std::size_t i = 0; i < logged.size(); ++i) {
      const StepStats& s = logged[i];
      const double want = tag == "train/lr" ? s.lr : tag == "train/loss" ? s.loss : s.grad_norm;
      BOOST_TEST_CONTEXT(tag << " at step " << s.step) {
        BOOST_TEST(points[i][0].get<std::int64_t>() == s.step);
        BOOST_TEST(points[i][1].get<double>() == static_cast<double>(static_cast<float>(want)));
      }
    }
  }
  BOOST_TEST(logged.front().loss > logged.back().loss);  // it trained
}

// train_mlp on 2 ranks with metrics= and tensorboard=, 20 steps with
// checkpoints at 10 and 20, then resumed from step 10 to 26: the JSONL gains
// the repeated steps 11-26, the folder a second events file. Every point
// TensorBoard shows must be the last JSONL record of its step, every step
// once.
BOOST_AUTO_TEST_CASE(train_mlp_scalars_equal_its_metrics_records) {
  const auto metrics = fresh("run.jsonl"), tb = fresh("run_tb"), ckpt = fresh("run_ckpt");
  const std::string args = "--config " + source_dir + "/examples/configs/ddp_host.yaml num_workers=1 save_every=10" +
                           " checkpoint_dir=" + ckpt.string() + " metrics=" + metrics.string() +
                           " tensorboard=" + tb.string();
  BOOST_REQUIRE_MESSAGE(dtrain::test::run_example(TRAIN_MLP_PATH, 2, args + " steps=20") == 0,
                        dtrain::test::last_log());
  BOOST_REQUIRE_MESSAGE(
      dtrain::test::run_example(TRAIN_MLP_PATH, 2,
                                args + " steps=26 resume=" + dtrain::checkpoint_path(ckpt, 10).string()) == 0,
      dtrain::test::last_log());

  std::map<std::int64_t, json> last;  // step -> its newest record
  std::size_t lines = 0;
  {
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line); ++lines) {
      const json r = json::parse(line);
      last[r.at("step").get<std::int64_t>()] = r;
    }
  }
  BOOST_REQUIRE_EQUAL(lines, 20u + 16u);
  BOOST_REQUIRE_EQUAL(last.size(), 26u);

  const json got = read_events(tb);
  const json& files = got.at("files");
  BOOST_REQUIRE_EQUAL(files.size(), 2u);
  const std::size_t steps_in[2] = {20, 16};
  const std::int64_t starts[2] = {1, 11};
  for (std::size_t i = 0; i < 2; ++i) {
    require_whole(files[i]);
    const json& events = files[i].at("events");
    // file_version, session start, one event per step.
    BOOST_REQUIRE_EQUAL(events.size(), 2 + steps_in[i]);
    BOOST_TEST(events[1].at("kind").get<std::string>() == "session_log");
    BOOST_TEST(events[1].at("step").get<std::int64_t>() == starts[i]);
    for (std::size_t k = 2; k < events.size(); ++k) BOOST_TEST(events[k].at("values").size() == 13u);
  }

  // tag -> where its value sits in a metrics record.
  const std::vector<std::pair<std::string, json::json_pointer>> fields{
      {"train/loss", json::json_pointer("/loss")},
      {"train/lr", json::json_pointer("/lr")},
      {"train/grad_norm", json::json_pointer("/grad_norm")},
      {"train/loss_scale", json::json_pointer("/loss_scale")},
      {"perf/samples_per_s", json::json_pointer("/samples_per_s")},
      {"perf/tokens_per_s", json::json_pointer("/tokens_per_s")},
      {"perf/step_ms", json::json_pointer("/step_ms")},
      {"memory/params_bytes", json::json_pointer("/memory/params")},
      {"memory/grads_bytes", json::json_pointer("/memory/grads")},
      {"memory/optimizer_bytes", json::json_pointer("/memory/optimizer")},
      {"memory/master_bytes", json::json_pointer("/memory/master")},
      {"memory/gathered_bytes", json::json_pointer("/memory/gathered")},
      {"memory/activations_bytes", json::json_pointer("/memory/activations")}};
  const json& scalars = got.at("scalars");
  BOOST_REQUIRE_EQUAL(scalars.size(), fields.size());
  // TensorBoard holds the float32 nearest the value; the JSONL prints it to
  // 10 significant digits. The two agree to within one float32 ulp relative
  // (2^-23): half an ulp of rounding plus 5e-10 of printing.
  const double tolerance = std::ldexp(1.0, -23);
  double worst = 0;
  std::size_t compared = 0;
  for (const auto& [tag, where] : fields) {
    BOOST_TEST_CONTEXT("tag " << tag) {
      const json& points = scalars.at(tag);
      BOOST_REQUIRE_EQUAL(points.size(), last.size());
      std::int64_t step = 0;
      for (const auto& p : points) {
        BOOST_REQUIRE_EQUAL(p[0].get<std::int64_t>(), ++step);
        const double want = last.at(step).at(where).get<double>(), have = p[1].get<double>();
        const double rel = std::abs(have - want) / std::max(std::abs(want), 1e-300);
        worst = std::max(worst, want == 0 ? std::abs(have) : rel);
        BOOST_TEST(std::abs(have - want) <= tolerance * std::abs(want),
                   "step " << step << ": " << have << " (TensorBoard) vs " << want);
        ++compared;
      }
    }
  }
  BOOST_TEST_MESSAGE(compared << " scalars equal their JSONL values; largest relative difference " << worst
                              << " (tolerance " << tolerance << ")");
}

// tensorboard= naming a path under a regular file: exit status 2 (a usage
// error), one error line naming it, and the metrics file of an earlier run
// left as it was (the events file is opened before the metrics file). One
// rank: with more, dtrain-run reports whichever rank ends first, and the
// others end with 1 when rank 0 leaves.
BOOST_AUTO_TEST_CASE(train_mlp_with_an_unusable_tensorboard_folder_is_a_usage_error) {
  const auto blocker = fresh("blocker"), metrics = fresh("kept.jsonl");
  std::ofstream(blocker) << "not a folder";
  std::ofstream(metrics) << "{\"step\": 1}\n";
  const auto dir = blocker / "tb";
  BOOST_TEST(dtrain::test::run_example(TRAIN_MLP_PATH, 1,
                                       "--config " + source_dir + "/examples/configs/ddp_host.yaml steps=3 metrics=" +
                                           metrics.string() + " tensorboard=" + dir.string()) == 2);
  const std::string log = dtrain::test::last_log();
  BOOST_TEST(
      log.find("train_mlp: error: cannot create the TensorBoard folder '" + dir.string() + "'") != std::string::npos,
      log);
  BOOST_TEST(read_file(metrics) == "{\"step\": 1}\n");
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

struct Png {
  bool valid = false;
  std::uint32_t width = 0, height = 0;
};

// The PNG signature, then the IHDR chunk that must come first: its width and
// height (big-endian).
Png read_png(const fs::path& p) {
  const std::string b = read_file(p);
  const std::string signature = "\x89PNG\r\n\x1a\n";
  if (b.size() < 33 || b.compare(0, 8, signature) != 0 || b.compare(12, 4, "IHDR") != 0) return {};
  auto be32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<unsigned char>(b[at + i]);
    return v;
  };
  return {be32(8) == 13, be32(16), be32(20)};
}

// plot_metrics.py with `args`; its exit status, stderr in scratch("plot.err").
int plot(const std::string& args) {
  return shell(dtrain::testing::test_python() + " " + plot_script + " " + args + " > " + scratch("plot.out").string() +
               " 2> " + scratch("plot.err").string());
}

void require_small_png(const fs::path& p) {
  BOOST_TEST_INFO(p);
  BOOST_REQUIRE(fs::exists(p));
  const Png png = read_png(p);
  BOOST_TEST(png.valid);
  BOOST_TEST(png.width > 0u);
  BOOST_TEST(png.height > 0u);
  BOOST_TEST(png.width <= 1600u);
  BOOST_TEST(fs::file_size(p) < 150'000u);
  BOOST_TEST_MESSAGE(p.filename() << ": " << png.width << " x " << png.height << ", " << fs::file_size(p) << " bytes");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(plots)

BOOST_AUTO_TEST_CASE(a_training_run_plots_to_valid_pngs) {
  const auto metrics = fresh("plot_run.jsonl");
  BOOST_REQUIRE_MESSAGE(dtrain::test::run_example(TRAIN_MLP_PATH, 2,
                                                  "--config " + source_dir +
                                                      "/examples/configs/ddp_host.yaml num_workers=1 steps=20 "
                                                      "metrics=" +
                                                      metrics.string()) == 0,
                        dtrain::test::last_log());
  const auto out = fresh("plots_one");
  BOOST_REQUIRE_MESSAGE(plot(metrics.string() + " --out " + out.string()) == 0, read_file(scratch("plot.err")));
  require_small_png(out / "loss.png");
  require_small_png(out / "throughput.png");
  const Png samples_only = read_png(out / "throughput.png");

  // The same run beside a copy whose tokens/s differ from its samples/s, as
  // a sequence model's do: two lines per plot, and a tokens/s panel; with
  // medians over 5 steps.
  const auto tokens = fresh("plot_tokens.jsonl");
  {
    std::ifstream in(metrics);
    std::ofstream o(tokens);
    for (std::string line; std::getline(in, line);) {
      json r = json::parse(line);
      r["tokens_per_s"] = r.at("samples_per_s").get<double>() * 64;
      o << r.dump() << "\n";
    }
  }
  const auto two = fresh("plots_two");
  BOOST_REQUIRE_MESSAGE(
      plot(metrics.string() + " " + tokens.string() + " --labels mlp,seq --smooth 5 --out " + two.string()) == 0,
      read_file(scratch("plot.err")));
  require_small_png(two / "loss.png");
  require_small_png(two / "throughput.png");
  BOOST_TEST(read_png(two / "throughput.png").height > samples_only.height);  // the second panel
}

BOOST_AUTO_TEST_CASE(the_strategy_benchmark_plots_to_a_valid_png) {
  const auto out = fresh("plots_scaling");
  BOOST_REQUIRE_MESSAGE(plot("--scaling " + source_dir + "/bench/results/strategies.json --out " + out.string()) == 0,
                        read_file(scratch("plot.err")));
  require_small_png(out / "scaling.png");
}

BOOST_AUTO_TEST_CASE(bad_input_is_one_line_and_status_2) {
  const auto empty = fresh("empty.jsonl"), malformed = fresh("malformed.jsonl"), no_loss = fresh("no_loss.jsonl");
  std::ofstream(empty) << "\n";
  std::ofstream(malformed) << "{\"step\": 1, \"loss\": 2.0, \"samples_per_s\": 5}\n{\"step\": 2, \"loss\": \n";
  std::ofstream(no_loss) << "{\"step\": 1, \"samples_per_s\": 5}\n";
  const auto out = fresh("plots_bad");
  const std::vector<std::pair<std::string, std::string>> cases{
      {fresh("missing.jsonl").string(), "cannot read"},
      {empty.string(), "empty.jsonl is empty"},
      {malformed.string(), "malformed.jsonl line 2 is not JSON"},
      {no_loss.string(), "no_loss.jsonl line 1 has no number 'loss'"},
      {empty.string() + " " + no_loss.string() + " --labels one", "--labels has 1 name(s) for 2 file(s)"},
      {no_loss.string() + " --smooth 0", "--smooth 0 is not at least 1"},
      {"--scaling " + source_dir + "/bench/results/comm_bandwidth.json", "comm_bandwidth.json has no results[]"}};
  for (const auto& [args, says] : cases) {
    BOOST_TEST_CONTEXT(args) {
      BOOST_TEST(plot(args + " --out " + out.string()) == 2);
      const std::string err = read_file(scratch("plot.err"));
      BOOST_TEST(err.starts_with("plot_metrics.py: error: "), err);
      BOOST_TEST(err.find(says) != std::string::npos, err);
      BOOST_TEST(std::count(err.begin(), err.end(), '\n') == 1, err);
    }
  }
  BOOST_TEST(fs::is_empty(out));  // nothing half-written
}

BOOST_AUTO_TEST_SUITE_END()

static bool init_unit_test() { return true; }

int main(int argc, char* argv[]) {
  const std::string suite = argc > 1 ? argv[1] : "";
  if (suite == "tensorboard") {
    if (const std::string why = dtrain::testing::python_venv_with(venv, "tensorboard", tensorboard_pin, 240);
        !why.empty()) {
      std::printf("%s: test skipped (exit 77)\n", why.c_str());
      return 77;
    }
  } else if (suite == "plots") {
    if (shell(dtrain::testing::test_python() + " -c 'import matplotlib' 2> /dev/null") != 0) {
      std::printf("%s has no matplotlib (apt-get install python3-matplotlib): test skipped (exit 77)\n",
                  dtrain::testing::test_python().c_str());
      return 77;
    }
  } else {
    std::fprintf(stderr, "usage: %s tensorboard|plots [Boost.Test options]\n", argv[0]);
    return 2;
  }
  std::string filter = "--run_test=" + suite;
  std::vector<char*> args{argv[0], filter.data()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  return boost::unit_test::unit_test_main(&init_unit_test, static_cast<int>(args.size()), args.data());
}
