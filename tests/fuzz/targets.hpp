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
//                     is_checkpoint share), then every piece it names read
//                     as a load reads it (the files it names must be the
//                     checkpoint's own: a file beside it must stay unread)
//   hf_index          the bytes as a transformers model.safetensors.index.json
//                     beside a valid shard (and a file outside the model's
//                     directory that no weight_map may reach):
//                     hf::open_checkpoint, then every tensor of every shard
//   config            the examples' command line: the bytes split at '\n'
//                     into arguments (key=value ...), or, when the first
//                     line is "yaml", the rest as a --config YAML file
//   hf_config         the bytes as a transformers config.json: hf::read_config,
//                     then the LoRA plan of every linear layer on it
//   adapter_config    the bytes as PEFT's adapter_config.json:
//                     hf::read_adapter_config, then plan_lora on a GPT-2 and
//                     a Llama-family model (target patterns, modules to save)
//   npy               the bytes as a .npy file: read_npy, as features and as
//                     labels, and load_npy_dataset with it as both
//   tokens            train_lm's token stream: the bytes as a .bin (DTRNTOK1)
//                     file, or as a .npy file when the first byte is odd
//   sft_records       the bytes as train_lm's .jsonl instruction records
//   launcher_flags    dtrain-run's command line, one argument per line
//   launch_env        a rank's environment, one NAME=VALUE per line, read by
//                     dtrain::init's discovery (torchrun, Slurm, Open MPI)
//   error_record      the bytes as a rank's error record (TORCHELASTIC_ERROR_FILE):
//                     dtrain-run's read_error_record
//   store_wire        the bytes sent over a live socket to a rendezvous store
//                     with a job token (they meet its handshake) and to one
//                     without (they meet its request parser); then an
//                     admitted client of each must still be served
//   wire_messages     the bytes as a rank's message (World::all_gather), set
//                     and read back through a live store, then decoded as
//                     the typed values ranks exchange

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli.hpp"
#include "launcher/launcher.hpp"
#include "lm/lm.hpp"

#include <dtrain/checkpoint/checkpoint.hpp>
#include <dtrain/checkpoint/state_io.hpp>
#include <dtrain/comm/store.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/hf/config.hpp>
#include <dtrain/hf/lora.hpp>
#include <dtrain/io/npy.hpp>
#include <dtrain/io/safetensors.hpp>
#include <dtrain/launch/env.hpp>

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
  // A load reads the pieces' files: each must be refused unless it is a
  // file of the checkpoint (missing here, or the index itself).
  try {
    const auto index = detail::parse_index(dir);
    detail::PieceReader reader(dir, index.files);
    for (const auto& [tensor, t] : index.tensors)
      for (const auto& [kind, pieces] : t.pieces)
        for (const auto& p : pieces) {
          try {
            (void)reader.bytes(tensor, kind, p);
          } catch (const dtrain::error&) {
          }
        }
  } catch (const dtrain::error&) {
  }
}

inline void hf_index(std::span<const unsigned char> data, const fs::path& scratch) {
  const fs::path dir = scratch / "hf_model";
  const fs::path shard = dir / "model-00001-of-00001.safetensors";
  if (!fs::exists(shard)) {
    fs::create_directories(dir);
    static const std::vector<float> values{1.f, 2.f, 3.f, 4.f};
    SafetensorsWriter w;
    w.add("model.a.weight", {2, 2}, values);
    w.add("b", {4}, values);
    w.write(shard);
    w.write(scratch / "outside.safetensors");  // valid, and no index may reach it
  }
  write_bytes(dir / "model.safetensors.index.json", data);
  // Names that make open_checkpoint look tensors up: a prefix to drop, a
  // fused pair, a transposed one.
  static const hf::TransformersNames names = [] {
    hf::TransformersNames n;
    n.tensors = {{"0.weight", {"model.a.weight"}}, {"0.fused", {"a.weight", "b"}}, {"1.weight", {"c"}}};
    n.transposed = {"0.weight"};
    n.optional_prefix = "model.";
    return n;
  }();
  try {
    const auto sources = hf::open_checkpoint(dir, names);
    for (const auto& f : sources.files)
      for (const auto& name : f.names()) (void)f.tensor(name);
  } catch (const dtrain::error&) {
  }
}

// The bytes split at '\n', each line cut at its first NUL (what an argument
// or environment entry can hold).
inline std::vector<std::string> lines_of(std::span<const unsigned char> data) {
  std::vector<std::string> lines(1);
  for (unsigned char c : data) {
    if (c == '\n')
      lines.emplace_back();
    else
      lines.back() += static_cast<char>(c);
  }
  for (auto& l : lines) l.resize(std::min(l.size(), l.find('\0')));
  return lines;
}

inline void config(std::span<const unsigned char> data, const fs::path& scratch) {
  auto lines = lines_of(data);
  std::vector<std::string> args{"train"};
  if (lines.front() == "yaml") {
    const fs::path file = scratch / "config.yaml";
    write_bytes(file, data.subspan(std::min(data.size(), std::size_t{5})));
    args.insert(args.end(), {"--config", file.string()});
  } else {
    for (auto& l : lines) {
      // --help prints and exits by design; --config FILE is the yaml mode
      // (an arbitrary path could name a device file).
      if (l != "--help" && l != "-h" && l != "--config") args.push_back(std::move(l));
    }
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  try {
    (void)examples::parse_cli<examples::Common>(
        static_cast<int>(argv.size()), argv.data(), "train", "usage\n", [](dtrain::ConfigReader&, examples::Common&) {},
        [](const examples::Common&) {});
  } catch (const dtrain::error&) {
  }
}

// A small model of each family, for the targets that resolve names on one.
inline const hf::LmConfig& small_model(bool gpt2) {
  static const hf::LmConfig models[2] = {
      hf::parse_config(nlohmann::ordered_json::parse(
                           R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "max_position_embeddings": 32})"),
                       "the fuzz target's llama"),
      hf::parse_config(nlohmann::ordered_json::parse(R"({"model_type": "gpt2", "vocab_size": 64, "n_embd": 16,
                                                         "n_layer": 2, "n_head": 4, "n_positions": 32})"),
                       "the fuzz target's gpt2")};
  return models[gpt2 ? 1 : 0];
}

inline void hf_config(std::span<const unsigned char> data, const fs::path& scratch) {
  const fs::path file = scratch / "config.json";
  write_bytes(file, data);
  try {
    const auto c = hf::read_config(file);
    // Every size was checked: the names of each layer's linears and the
    // adapters on all of them are what the first use of a config computes.
    // That work is linear in the layers (ten million take seconds under
    // ASan, which is no parser's fault), so only up to 4096 of them.
    if (c.num_hidden_layers > 4096) return;
    hf::LoraConfig lora;
    lora.r = 1;
    lora.targets = {"all-linear"};
    (void)hf::plan_lora(c, lora);
  } catch (const dtrain::error&) {
  }
}

inline void adapter_config(std::span<const unsigned char> data, const fs::path& scratch) {
  const fs::path dir = scratch / "adapter";
  fs::create_directories(dir);
  write_bytes(dir / "adapter_config.json", data);
  try {
    const auto lora = hf::read_adapter_config(dir);
    for (bool gpt2 : {false, true}) {
      try {
        const auto& c = small_model(gpt2);
        const auto plan = hf::plan_lora(c, lora);
        (void)hf::peft_names(c, plan);
        (void)hf::adapter_config_json(c, lora, "base");
      } catch (const dtrain::error&) {
      }
    }
  } catch (const dtrain::error&) {
  }
}

inline void npy(std::span<const unsigned char> data, const fs::path& scratch) {
  const fs::path file = scratch / "input.npy";
  write_bytes(file, data);
  try {
    const auto a = detail::read_npy(file);
    try {
      (void)detail::npy_features(a, "input.npy");
    } catch (const dtrain::error&) {
    }
    try {
      (void)detail::npy_labels(a, "input.npy");
    } catch (const dtrain::error&) {
    }
  } catch (const dtrain::error&) {
  }
  try {
    (void)load_npy_dataset(file, file);
  } catch (const dtrain::error&) {
  }
}

inline void tokens(std::span<const unsigned char> data, const fs::path& scratch) {
  const bool as_npy = !data.empty() && (data[0] & 1) != 0;
  const fs::path file = scratch / (as_npy ? "tokens.npy" : "tokens.bin");
  write_bytes(file, as_npy ? data.subspan(1) : data);
  try {
    (void)::lm::read_tokens(file.string(), 4, 1000);
  } catch (const dtrain::error&) {
  }
}

inline void sft_records(std::span<const unsigned char> data, const fs::path& scratch) {
  const fs::path file = scratch / "records.jsonl";
  write_bytes(file, data);
  try {
    (void)::lm::read_tokens(file.string(), 8, 1000);
  } catch (const dtrain::error&) {
  }
}

inline void launcher_flags(std::span<const unsigned char> data, const fs::path&) {
  const auto args = lines_of(data);
  try {
    const auto o = parse_run_options(args);
    // What dtrain-run does next with the options, short of starting ranks.
    check_slurm_nodes(o, [](const std::string& name) -> std::optional<std::string> {
      if (name == "SLURM_JOB_ID") return "7";
      if (name == "SLURM_JOB_NUM_NODES") return "2";
      return std::nullopt;
    });
    (void)resolve_nproc(o.nproc, 2, 4);
  } catch (const dtrain::error&) {
  }
}

inline void launch_env(std::span<const unsigned char> data, const fs::path&) {
  std::map<std::string, std::string> vars;
  for (const auto& l : lines_of(data)) {
    const auto eq = l.find('=');
    if (eq != std::string::npos) vars[l.substr(0, eq)] = l.substr(eq + 1);
  }
  const EnvLookup env = [&](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  try {
    (void)discover_env(env);
  } catch (const dtrain::error&) {
  }
}

inline void error_record(std::span<const unsigned char> data, const fs::path& scratch) {
  const fs::path file = scratch / "error.json";
  write_bytes(file, data);
  (void)read_error_record(file);  // nothing to reject with: an unreadable record is no record
}

// A live store of each kind, for the whole fuzzing process, with an admitted
// client each. A short handshake deadline: an input that stops half-way
// does not hold a connection long.
struct LiveStores {
  std::string token = new_job_token();
  StoreLimits limits = [] {
    StoreLimits l;
    l.handshake_timeout = std::chrono::milliseconds(300);
    l.max_request_bytes = std::size_t{1} << 20;
    return l;
  }();
  TcpStoreServer secured{0, "127.0.0.1", token, limits};
  TcpStoreServer open{0, "127.0.0.1", {}, limits};
  TcpStore secured_client{"127.0.0.1", secured.port(), std::chrono::seconds(5), token};
  TcpStore open_client{"127.0.0.1", open.port(), std::chrono::seconds(5)};

  static LiveStores& get() {
    static LiveStores stores;
    return stores;
  }
};

// Sends `data` to 127.0.0.1:port after the server's hello, ends the
// sending side and reads until the server closes (or 2 s pass).
inline void send_to_store(int port, std::span<const unsigned char> data) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t w = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (w <= 0) break;
      sent += static_cast<std::size_t>(w);
    }
    ::shutdown(fd, SHUT_WR);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    char buf[4096];
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      if (::recv(fd, buf, sizeof buf, 0) <= 0) break;
    }
  }
  ::close(fd);
}

inline void store_wire(std::span<const unsigned char> data, const fs::path&) {
  auto& s = LiveStores::get();
  send_to_store(s.secured.port(), data);
  send_to_store(s.open.port(), data);
  // Whatever the input did, the job's own clients are still served.
  for (TcpStore* client : {&s.secured_client, &s.open_client}) {
    client->set("canary", "alive");
    if (client->get("canary", std::chrono::seconds(5)) != "alive")
      throw std::logic_error("a rendezvous store lost a key after a hostile client");
  }
}

inline void wire_messages(std::span<const unsigned char> data, const fs::path&) {
  auto& s = LiveStores::get();
  s.secured_client.set("message", std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
  const std::string bytes = s.secured_client.get("message");
  const auto decode_as = [&]<class T>(const T*) {
    try {
      (void)wire::decode<T>(bytes);
    } catch (const dtrain::error&) {
    }
  };
  decode_as(static_cast<const std::int64_t*>(nullptr));
  decode_as(static_cast<const std::string*>(nullptr));
  decode_as(static_cast<const std::vector<std::int64_t>*>(nullptr));
  decode_as(static_cast<const std::vector<std::string>*>(nullptr));
  decode_as(static_cast<const std::vector<std::vector<std::int64_t>>*>(nullptr));
  decode_as(static_cast<const detail::RankSave*>(nullptr));
  decode_as(static_cast<const std::vector<detail::SamplerPosition>*>(nullptr));
}

struct Target {
  const char* name;
  void (*run)(std::span<const unsigned char>, const fs::path&);
};

// Every target, by the name its corpus folder (tests/corpus/NAME) has.
inline constexpr Target targets[] = {{"safetensors", safetensors},
                                     {"checkpoint_index", checkpoint_index},
                                     {"hf_index", hf_index},
                                     {"config", config},
                                     {"hf_config", hf_config},
                                     {"adapter_config", adapter_config},
                                     {"npy", npy},
                                     {"tokens", tokens},
                                     {"sft_records", sft_records},
                                     {"launcher_flags", launcher_flags},
                                     {"launch_env", launch_env},
                                     {"error_record", error_record},
                                     {"store_wire", store_wire},
                                     {"wire_messages", wire_messages}};

}  // namespace dtrain::fuzz
