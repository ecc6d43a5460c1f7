#pragma once
// The inputs the fuzz harnesses feed to dtrain's parsers, shared by the
// libFuzzer entry point (fuzz_main.cpp, built by tests/fuzz/run_fuzz.sh with
// clang) and the corpus regression test (corpus_test.cpp, in the normal
// build, which replays every file under tests/corpus/<target>/).
//
// A parser may reject its input only with a dtrain::error (a message naming
// the input and what was expected); anything else escaping, a crash, a
// sanitizer report, a hang or a leak is a finding.
//
//   safetensors       the bytes as a .safetensors file: SafetensorsFile::open,
//                     every tensor's view, then load_safetensors_dataset
//   checkpoint_index  the bytes as a checkpoint's index.json: list_checkpoints
//                     over its parent (the parser checkpoint_info and
//                     is_checkpoint share)
//   config            the examples' command line: the bytes split at '\n'
//                     into arguments (key=value ...), or, when the first
//                     line is "yaml", the rest as a --config YAML file

#include <dtrain/checkpoint/checkpoint.hpp>
#include <dtrain/io/safetensors.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli.hpp"

namespace dtrain::fuzz {

namespace fs = std::filesystem;

inline void write_bytes(const fs::path& path, std::span<const unsigned char> data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

inline void safetensors(std::span<const unsigned char> data, const fs::path& scratch) {
  const fs::path file = scratch / "input.safetensors";
  write_bytes(file, data);
  try {
    const auto f = SafetensorsFile::open(file);
    std::size_t total = 0;
    for (const auto& name : f.names()) total += f.tensor(name).bytes.size();
    (void)total;
    (void)f.metadata();
  } catch (const dtrain::error&) {
  }
  try {
    (void)load_safetensors_dataset(file);
  } catch (const dtrain::error&) {
  }
}

inline void checkpoint_index(std::span<const unsigned char> data, const fs::path& scratch) {
  const fs::path dir = scratch / "ckpt" / "step-00000001";
  fs::create_directories(dir);
  write_bytes(dir / std::string(checkpoint_index_name), data);
  // checkpoint_info, is_checkpoint and list_checkpoints all read the index
  // through one parser, and list_checkpoints (what resume=latest calls) is the
  // strictest of them: it lets anything but a checkpoint_error escape, so one
  // parse per input checks all three.
  (void)list_checkpoints(scratch / "ckpt");
}

inline void config(std::span<const unsigned char> data, const fs::path& scratch) {
  std::vector<std::string> lines(1);
  for (unsigned char c : data) {
    if (c == '\n') lines.emplace_back();
    else lines.back() += static_cast<char>(c);
  }
  std::vector<std::string> args{"train"};
  if (lines.front() == "yaml") {
    const fs::path file = scratch / "config.yaml";
    write_bytes(file, data.subspan(std::min(data.size(), std::size_t{5})));
    args.insert(args.end(), {"--config", file.string()});
  } else {
    for (auto& l : lines) {
      l.resize(std::min(l.size(), l.find('\0')));  // what a process's argv can hold
      // --help prints and exits by design; --config FILE is the yaml mode
      // (an arbitrary path could name a device file).
      if (l != "--help" && l != "-h" && l != "--config") args.push_back(std::move(l));
    }
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  try {
    (void)examples::parse_cli<examples::Common>(
        static_cast<int>(argv.size()), argv.data(), "train", "usage\n",
        [](dtrain::ConfigReader&, examples::Common&) {}, [](const examples::Common&) {});
  } catch (const dtrain::error&) {
  }
}

}  // namespace dtrain::fuzz
