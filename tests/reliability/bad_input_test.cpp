// Bad input everywhere: every input a user hands dtrain (config keys and
// values, config files, safetensors and .npy data, checkpoint directories,
// pretrained weights, dtrain-run's arguments, the launch environment
// variables) is fed something wrong, as real processes. Each must end with
// one line "<program>: error: ..." naming the input and what was expected,
// exit status 2 for a usage error and 1 for a safetensors or checkpoint file
// found damaged (dtrain::exit_code, docs/reliability.md), and leave every file on disk as it was: the previous
// run's checkpoints, metrics and parameters in the job folder, and the bad
// inputs themselves.

#define BOOST_TEST_MODULE reliability_bad_input
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "launch/process.hpp"
#include <boost/test/unit_test.hpp>

namespace {

using namespace dtrain::test;
namespace fs = std::filesystem;

const std::vector<std::string> model{"hidden=8", "samples=64", "features=4", "classes=3", "batch_size=8"};

void write(const fs::path& file, const std::string& text) { std::ofstream(file, std::ios::binary) << text; }

// A finished job (a checkpoint, metrics, final parameters) and the bad inputs.
struct Scene {
  TempDir root;
  fs::path job = root.path() / "job", in = root.path() / "inputs";

  Scene() {
    fs::create_directories(in);
    std::vector<std::string> args{TRAIN_MLP_PATH, "steps=2", "save_every=2"};
    args.insert(args.end(), model.begin(), model.end());
    args.insert(args.end(), {"checkpoint_dir=" + (job / "ck").string(), "metrics=" + (job / "m.jsonl").string(),
                             "save_params=" + (job / "final.safetensors").string()});
    const Finished f = Process(args).wait(120);
    BOOST_REQUIRE_MESSAGE(f.exited_with(0), "the job to protect did not run:\n" << f.err);
    const fs::path step = job / "ck" / "step-00000002";
    BOOST_REQUIRE(fs::exists(step / "index.json"));
    write(in / "bad.yaml", "steps: [1\n");
    write(in / "list.yaml", "- steps\n- 2\n");
    write(in / "garbage.safetensors", "this is not a safetensors file\n");
    write(in / "x.npy", "not numpy either\n");
    const std::string params = read_text(job / "final.safetensors");
    write(in / "truncated.safetensors", params.substr(0, params.size() / 2));
    fs::create_directories(in / "empty");
    fs::copy(step, in / "bad_index");
    write(in / "bad_index" / "index.json", "{\"bro");
    fs::copy(step, in / "truncated_ck");
    fs::resize_file(in / "truncated_ck" / "shard-00000-of-00001.safetensors", 100);
  }

  // Every file under the scene: path -> contents.
  std::map<std::string, std::string> snapshot() const {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(root.path()))
      files[e.path().string()] = e.is_regular_file() ? read_text(e.path()) : "<dir>";
    return files;
  }
};

Scene& scene() {
  static Scene s;
  return s;
}

// train_mlp run alone, writing into the protected job folder, plus `extra`.
std::vector<std::string> train_mlp(std::vector<std::string> extra) {
  const Scene& s = scene();
  std::vector<std::string> args{TRAIN_MLP_PATH, "steps=4", "save_every=2"};
  args.insert(args.end(), model.begin(), model.end());
  args.insert(args.end(), {"checkpoint_dir=" + (s.job / "ck").string(), "metrics=" + (s.job / "m.jsonl").string(),
                           "save_params=" + (s.job / "final.safetensors").string()});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<std::string> dtrain_run(std::vector<std::string> options, bool with_program = true) {
  std::vector<std::string> args{DTRAIN_RUN_PATH};
  args.insert(args.end(), options.begin(), options.end());
  if (with_program) {
    const auto program = train_mlp({});
    args.insert(args.end(), program.begin(), program.end());
  }
  return args;
}

std::string in(const std::string& name) { return (scene().in / name).string(); }

// Runs it; checks the status, the error line and that nothing changed.
void rejects(const std::vector<std::string>& args, int status, const std::string& needle, const EnvChanges& env = {}) {
  const auto before = scene().snapshot();
  const Finished f = Process(args, env).wait(60);
  std::string shown;
  for (std::size_t i = 1; i < args.size(); ++i) {  // appended piece by piece: GCC 12's -Wrestrict misfires on " " + s
    shown += ' ';
    shown.append(args[i], args[i].rfind('/') + 1);
  }
  BOOST_TEST_CONTEXT(fs::path(args[0]).filename().string() << shown << "\nstderr:\n" << f.err) {
    BOOST_TEST(f.exited_with(status), "expected exit status " << status);
    const auto at = f.err.find("error: ");
    BOOST_TEST_REQUIRE(at != std::string::npos);
    const std::string line = f.err.substr(at, f.err.find('\n', at) - at);
    BOOST_TEST(line.find(needle) != std::string::npos, "the error line does not say '" << needle << "'");
    BOOST_TEST((scene().snapshot() == before), "files on disk changed");
  }
}

// The launch variables of a torchrun-started rank 0 of 2, then `changes`.
EnvChanges torchrun_env(EnvChanges changes) {
  EnvChanges env{{"RANK", "0"},
                 {"WORLD_SIZE", "2"},
                 {"LOCAL_RANK", "0"},
                 {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"DTRAIN_JOB_TOKEN", "bad-input-test-job-token-0123456789abcdef"},
                 {"MASTER_PORT", "29999"}};
  env.insert(env.end(), changes.begin(), changes.end());
  return env;
}

}  // namespace

BOOST_AUTO_TEST_CASE(config_keys_and_values) {
  rejects(train_mlp({"bogus=1"}), 2, "unknown config key 'bogus'");
  rejects(train_mlp({"steps=abc"}), 2, "config key 'steps' = 'abc' is not an integer");
  rejects(train_mlp({"lr=fast"}), 2, "config key 'lr' = 'fast' is not a number");
  rejects(train_mlp({"init_strict=maybe"}), 2, "config key 'init_strict' = 'maybe' is not true or false");
  rejects(train_mlp({"steps=[1,2]"}), 2, "config key 'steps' = a list is not an integer");
  rejects(train_mlp({"batch_size=0"}), 2, "batch_size = 0 is not at least 1");
  rejects(train_mlp({"precision=fp64"}), 2, "precision = 'fp64' is unknown");
  rejects(train_mlp({"strategy=fsdp"}), 2, "strategy = 'fsdp' is unknown");
  rejects(train_mlp({"hidden=32,x"}), 2, "config key 'hidden' = '32,x' is not a list of integers");
  rejects(train_mlp({"timeout_s=-1"}), 2, "timeout_s is out of range");
  rejects(train_mlp({"resume=" + in("nowhere")}), 2, "is neither latest nor an existing directory");
  // A name the system refuses to look up (found by fuzzing: it escaped as a
  // std::filesystem_error).
  rejects(train_mlp({"resume=" + in(std::string(300, 'e'))}), 2,
          "is neither latest nor an existing directory (File name too long)");
  rejects(train_mlp({"keyvalue"}), 2, "keyvalue");
}

BOOST_AUTO_TEST_CASE(config_files) {
  rejects(train_mlp({"--config", in("bad.yaml")}), 2, "cannot read config");
  rejects(train_mlp({"--config", in("missing.yaml")}), 2, "cannot read config");
  rejects(train_mlp({"--config", in("list.yaml")}), 2, "is not a mapping of keys to values");
  rejects(train_mlp({"--config"}), 2, "--config needs a file");
}

BOOST_AUTO_TEST_CASE(data_files) {
  rejects(train_mlp({"data=" + in("garbage.safetensors")}), 1, "is not a valid safetensors file");
  rejects(train_mlp({"data=" + in("truncated.safetensors")}), 1, "is not a valid safetensors file");
  rejects(train_mlp({"data=" + in("missing.safetensors")}), 1, "cannot open");
  // .npy data is read as configuration (dtrain::config_error): status 2
  rejects(train_mlp({"data=" + in("x.npy") + "," + in("x.npy")}), 2, "is not a .npy file");
  rejects(train_mlp({"data=" + in("missing.npy") + "," + in("x.npy")}), 2, "cannot open");
}

BOOST_AUTO_TEST_CASE(checkpoints_and_pretrained_weights) {
  rejects(train_mlp({"resume=" + in("empty")}), 1, "it has no index.json");
  rejects(train_mlp({"resume=" + in("bad_index")}), 1, "is not a valid dtrain checkpoint index");
  rejects(train_mlp({"resume=" + in("truncated_ck")}), 1, "but the index recorded");
  // a checkpoint of another model: a usage error
  rejects(train_mlp({"resume=" + (scene().job / "ck" / "step-00000002").string(), "hidden=16"}), 2,
          "was saved for a different model");
  rejects(train_mlp({"init_from=" + in("garbage.safetensors")}), 1, "is not a valid safetensors file");
  rejects(train_mlp({"init_from=" + in("truncated.safetensors")}), 1, "is not a valid safetensors file");
}

BOOST_AUTO_TEST_CASE(launcher_arguments) {
  rejects(dtrain_run({"--nproc-per-node", "0"}), 2, "--nproc-per-node 0 is not a process count");
  rejects(dtrain_run({"--nnodes", "x"}), 2, "--nnodes x is not an integer");
  rejects(dtrain_run({"--node-rank", "3", "--nnodes", "2"}), 2, "--node-rank");
  rejects(dtrain_run({"--max-restarts", "-1"}), 2, "--max-restarts -1");
  rejects(dtrain_run({"--master-port", "70000"}), 2, "--master-port 70000");
  rejects(dtrain_run({"--bogus"}), 2, "unknown option --bogus");
  rejects(dtrain_run({"--nproc-per-node"}, false), 2, "--nproc-per-node");
  rejects(dtrain_run({}, false), 2, "no PROGRAM to run");
}

BOOST_AUTO_TEST_CASE(launch_environment) {
  const auto mlp = train_mlp({});
  rejects(mlp, 2, "RANK='abc' is not an integer", torchrun_env({{"RANK", "abc"}}));
  rejects(mlp, 2, "RANK=2 is not below WORLD_SIZE=2", torchrun_env({{"RANK", "2"}}));
  rejects(mlp, 2, "LOCAL_RANK is not set", torchrun_env({{"LOCAL_RANK", std::nullopt}}));
  rejects(mlp, 2, "MASTER_PORT='abc' is not an integer", torchrun_env({{"MASTER_PORT", "abc"}}));
  rejects(mlp, 2, "SLURM_NTASKS='x' is not an integer", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "x"}});
  rejects(mlp, 2, "OMPI_COMM_WORLD_LOCAL_RANK is not set",
          {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
  rejects(mlp, 2, "DTRAIN_HOST_TRANSPORT='bogus' is not one of auto|shm|gloo", {{"DTRAIN_HOST_TRANSPORT", "bogus"}});
  rejects(mlp, 2, "DTRAIN_COMM_TIMEOUT_S='abc' is not a positive number", {{"DTRAIN_COMM_TIMEOUT_S", "abc"}});
  rejects(mlp, 2, "DTRAIN_SHM_WAIT='zz' is not one of", {{"DTRAIN_SHM_WAIT", "zz"}});
  rejects(mlp, 2, "DTRAIN_GPU_TRANSPORT='mpi' is not one of nccl|host", {{"DTRAIN_GPU_TRANSPORT", "mpi"}});
  rejects(mlp, 2, "DTRAIN_SHM_CHUNK_KIB='3' is not a multiple of 4", {{"DTRAIN_SHM_CHUNK_KIB", "3"}});
  rejects(mlp, 2, "DTRAIN_FAULT_INJECT='backwards:0:1' names an unknown point",
          {{"DTRAIN_FAULT_INJECT", "backwards:0:1"}});
  // Through the launcher: the ranks' usage error is the job's exit status.
  rejects(dtrain_run({"--nproc-per-node", "2"}), 2, "DTRAIN_HOST_TRANSPORT='bogus'",
          {{"DTRAIN_HOST_TRANSPORT", "bogus"}});
}
