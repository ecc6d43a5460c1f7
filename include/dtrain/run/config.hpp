#pragma once
// A command-line and YAML config reader built from declared keys: each key
// is bound to a variable (its value is the default), and `--help` is
// written from the declarations. yaml-cpp parses both the files and the
// values, so a program compiled with g++ includes this (nvcc does not take
// yaml-cpp: keep it out of .cu files) and links yaml-cpp.
//
//   dtrain::FitOptions fit{.steps = 1000};
//   float lr = 3e-4f;
//   dtrain::ConfigReader config("train", "Trains my model on every rank.");
//   config.section("Training");
//   dtrain::declare_fit_keys(config, fit);
//   config.add("lr", lr, "peak learning rate");
//   if (!config.parse(argc, argv)) return 0;   // --help was printed
//
//   ./train --config run.yaml steps=5000 lr=1e-4
//
// Later arguments win: --config files and key=value pairs apply in order.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "dtrain/core/error.hpp"
#include "dtrain/run/fit.hpp"

namespace dtrain {

class ConfigReader {
 public:
  explicit ConfigReader(std::string program, std::string about = {})
      : program_(std::move(program)), about_(std::move(about)) {}

  // Starts a titled group of keys in --help.
  ConfigReader& section(std::string title) {
    keys_.push_back({"", std::move(title), "", "", {}});
    return *this;
  }

  // Declares `key`, bound to `target`: bool, an integer, a floating-point
  // number, std::string, std::filesystem::path, std::vector<std::int64_t>
  // (a YAML list or "256,256") or std::vector<std::string>.
  template <class T>
  ConfigReader& add(std::string key, T& target, std::string help) {
    add_key(key, std::move(help), form<T>(), show(target),
            [key, &target](const YAML::Node& v) { target = as<T>(v, key); });
    return *this;
  }

  // Declares `key` bound to an enum, written as one of `names`.
  template <class E, std::size_t N>
  requires std::is_enum_v<E> ConfigReader& add(std::string key, E& target, std::string help,
                                               const std::pair<std::string_view, E> (&names)[N]) {
    std::string form, shown;
    for (const auto& [name, value] : names) {
      if (!form.empty()) form += " | ";
      form += name;
      if (value == target) shown = name;
    }
    add_key(key, std::move(help), form, shown, [key, &target, &names, form](const YAML::Node& v) {
      if (v.IsScalar())
        for (const auto& [name, value] : names)
          if (v.Scalar() == name) {
            target = value;
            return;
          }
      throw config_error("config key '" + key + "' = " + (v.IsScalar() ? "'" + v.Scalar() + "'" : "a list or map") +
                             " is not one of " + form,
                         "give " + key + " one of " + form);
    });
    return *this;
  }

  // Runs after every argument is applied (cross-key checks).
  ConfigReader& check(std::function<void()> validate) {
    checks_.push_back(std::move(validate));
    return *this;
  }

  // Applies --config FILE.yaml and key=value arguments in order. Returns
  // false when --help or -h asked for the usage, which is then printed.
  bool parse(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    for (const std::string& a : args)
      if (a == "--help" || a == "-h") {
        const std::string h = help();
        std::fwrite(h.data(), 1, h.size(), stdout);
        return false;
      }
    parse(args);
    return true;
  }

  void parse(const std::vector<std::string>& args) {
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& arg = args[i];
      if (arg == "--config") {
        if (i + 1 >= args.size()) throw config_error("--config needs a file", "pass --config FILE.yaml");
        load_file(args[++i]);
        continue;
      }
      const auto eq = arg.find('=');
      if (eq == std::string::npos || eq == 0)
        throw config_error("argument '" + arg + "' is neither --config FILE nor key=value",
                           "run " + program_ + " --help");
      YAML::Node value;
      try {
        value = YAML::Load(arg.substr(eq + 1));
      } catch (const YAML::Exception& e) {
        throw config_error("argument '" + arg + "': the value is not valid YAML: " + e.what(),
                           "quote it, e.g. key='a: b', or write a plain value (numbers, names, 256,256)");
      }
      set(arg.substr(0, eq), value);
    }
    for (const auto& c : checks_) c();
  }

  // Sets one declared key from a YAML value.
  void set(const std::string& key, const YAML::Node& value) {
    for (const Key& k : keys_)
      // a section heading has a name "" and no setter (found by fuzzing)
      if (k.name == key && k.set) return k.set(value);
    throw config_error("unknown config key '" + key + "'", "run " + program_ + " --help for the list of keys");
  }

  // The usage text: the program, its description, every key with what it
  // takes, its default and its help.
  std::string help() const {
    // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, falsely) on
    // some chains of std::string operator+.
    std::string out = "usage: ";
    out.append(program_).append(" [--config FILE.yaml] [key=value ...]\n");
    if (!about_.empty()) out.append("\n").append(about_).append(about_.back() == '\n' ? "" : "\n");
    for (const Key& k : keys_) {
      if (k.name.empty()) {
        out.append("\n").append(k.help).append(":\n");
        continue;
      }
      out.append("  ").append(k.name).append(" (").append(k.form);
      if (!k.default_text.empty()) out.append(", default ").append(k.default_text);
      out.append(")\n      ").append(k.help).append("\n");
    }
    return out;
  }

 private:
  struct Key {
    std::string name;  // empty: a section title in help
    std::string help;
    std::string form;
    std::string default_text;
    std::function<void(const YAML::Node&)> set;
  };

  void load_file(const std::string& file) {
    YAML::Node root;
    try {
      root = YAML::LoadFile(file);
    } catch (const YAML::Exception& e) {
      throw config_error("cannot read config '" + file + "': " + e.what(), "check the path and the YAML syntax");
    }
    if (!root.IsMap() && !root.IsNull())
      throw config_error("config '" + file + "' is not a mapping of keys to values", "write one `key: value` per line");
    for (const auto& kv : root) {
      if (!kv.first.IsScalar())
        throw config_error("config '" + file + "' has a key that is not a plain name",
                           "write one `key: value` per line");
      set(kv.first.as<std::string>(), kv.second);
    }
  }

  void add_key(const std::string& key, std::string help, std::string form, std::string shown,
               std::function<void(const YAML::Node&)> set) {
    if (key.empty() || key.find('=') != std::string::npos)
      throw config_error("ConfigReader: the key '" + key + "' is empty or holds '='", "declare a plain name");
    for (const Key& k : keys_)
      if (k.name == key) throw config_error("ConfigReader: the key '" + key + "' is declared twice", "declare it once");
    keys_.push_back({key, std::move(help), std::move(form), std::move(shown), std::move(set)});
  }

  template <class T>
  static std::string form() {
    if constexpr (std::is_same_v<T, bool>)
      return "true | false";
    else if constexpr (std::is_integral_v<T>)
      return "integer";
    else if constexpr (std::is_floating_point_v<T>)
      return "number";
    else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>)
      return "integers, e.g. 256,256";
    else if constexpr (std::is_same_v<T, std::vector<std::string>>)
      return "names, e.g. a,b";
    else if constexpr (std::is_same_v<T, std::filesystem::path>)
      return "path";
    else
      return "text";
  }

  template <class T>
  static std::string show(const T& v) {
    if constexpr (std::is_same_v<T, bool>)
      return v ? "true" : "false";
    else if constexpr (std::is_arithmetic_v<T>) {
      std::ostringstream s;
      s << v;
      return s.str();
    } else if constexpr (std::is_same_v<T, std::filesystem::path>)
      return v.string();
    else if constexpr (std::is_same_v<T, std::string>)
      return v;
    else {
      std::ostringstream s;
      for (std::size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
      return s.str();
    }
  }

  template <class T>
  static T as(const YAML::Node& n, const std::string& key) {
    const auto fail = [&]() -> T {
      std::string value = n.IsScalar()     ? "'" + n.Scalar() + "'"
                          : n.IsSequence() ? "a list"
                          : n.IsMap()      ? "a map"
                                           : "nothing";
      throw config_error("config key '" + key + "' = " + value + " is not " + form_phrase<T>(),
                         "give " + key + " " + form_phrase<T>());
    };
    try {
      if constexpr (std::is_same_v<T, std::filesystem::path>) {
        if (!n.IsScalar()) return fail();
        return std::filesystem::path(n.as<std::string>());
      } else if constexpr (std::is_same_v<T, std::vector<std::int64_t>> ||
                           std::is_same_v<T, std::vector<std::string>>) {
        using E = typename T::value_type;
        T out;
        if (n.IsSequence()) {
          for (const auto& w : n) out.push_back(w.as<E>());
          return out;
        }
        if (!n.IsScalar()) return fail();
        std::stringstream in(n.Scalar());
        for (std::string part; std::getline(in, part, ',');) out.push_back(YAML::Load(part).as<E>());
        return out;
      } else {
        if (!n.IsScalar()) return fail();
        return n.as<T>();
      }
    } catch (const YAML::Exception&) {
      return fail();
    }
  }

  template <class T>
  static std::string form_phrase() {
    if constexpr (std::is_same_v<T, bool>)
      return "true or false";
    else if constexpr (std::is_integral_v<T>)
      return "an integer";
    else if constexpr (std::is_floating_point_v<T>)
      return "a number";
    else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>)
      return "a list of integers (e.g. 256,256)";
    else if constexpr (std::is_same_v<T, std::vector<std::string>>)
      return "a list of names (e.g. a,b)";
    else
      return "a single value (not a list or a map)";
  }

  std::string program_, about_;
  std::vector<Key> keys_;
  std::vector<std::function<void()>> checks_;
};

// fit's options as config keys: steps, batch_size, checkpoints, resume,
// evaluation, early stop, logging. `metrics` names the JSON-lines file.
inline void declare_fit_keys(ConfigReader& c, FitOptions& o) {
  c.add("steps", o.steps, "optimizer steps in all (a resumed run continues to it)");
  c.add("batch_size", o.batch_size, "rows per rank per micro-batch");
  c.add("num_workers", o.num_workers, "data loader threads per rank (0: gather on the training thread)");
  c.add("shuffle", o.shuffle, "shuffle the training data every epoch");
  c.add("data_seed", o.seed, "the shuffle's seed");
  c.add("checkpoint_dir", o.checkpoint_dir, "where checkpoints go, as step-<n> folders");
  c.add("save_every", o.save_every, "save a resumable checkpoint every N steps and at the end (0: at the end)");
  c.add("save_final", o.save_final, "save a checkpoint after the last step");
  c.add("keep_last", o.keep_last, "keep only the newest K checkpoints (0: all)");
  c.add("consolidated", o.consolidated, "checkpoints also hold model.safetensors (fp32, readable by Python)");
  c.add("resume", o.resume, "latest (the newest complete checkpoint, if any) | a checkpoint folder | empty: none");
  c.add("on_save_error", o.on_save_error, "what a failed save (full disk) does", save_error_policy_names);
  c.add("on_nonfinite", o.on_nonfinite, "what a step with an inf/NaN loss or gradient does (skip is the Trainer's)",
        nonfinite_policy_names);
  c.add("straggler_factor", o.straggler_factor, "name a rank computing this many times the median's (0: off)");
  // Held by the check that converts it, which lives as long as the reader.
  auto signals = std::make_shared<std::vector<std::string>>(preemption_signal_names(o.preempt_signals));
  c.add("preempt_signals", *signals, "signals that make every rank save and exit with 75 (TERM, USR1, USR2, INT, HUP)");
  c.check([&o, signals] { o.preempt_signals = preemption_signal_numbers(*signals); });
  c.add("eval_every", o.eval_every, "evaluate every N steps and at the end (0: at the end)");
  c.add("eval_batches", o.eval_batches, "batches per rank per evaluation (0: the whole evaluation set)");
  c.add("monitor", o.monitor, "early stop watches this: loss or a metric's name");
  c.add("maximize", o.maximize, "true when a larger monitored value is better (accuracy)");
  c.add("patience", o.patience, "stop after K evaluations without improvement (0: never)");
  c.add("min_delta", o.min_delta, "the least change that counts as improvement");
  c.add("log_every", o.log_every, "a progress line every N steps");
  c.add("progress", o.progress, "print progress lines");
  c.add("metrics", o.metrics_file, "JSON-lines file written by rank 0 (one object per step and evaluation)");
  c.add("tensorboard", o.tensorboard_dir, "a folder for TensorBoard scalars, written by rank 0");
  c.add("peak_tflops", o.peak_tflops, "one rank's peak TFLOP/s: progress lines add TFLOP/s and MFU (0: not shown)");
  c.add("save_params", o.save_params, "every parameter as fp32 safetensors at the end");
  c.check([&o] { o.validate(); });
}

}  // namespace dtrain
