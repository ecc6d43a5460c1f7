#include "launcher/launcher.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <yaml-cpp/yaml.h>

#include "dtrain/run/preemption.hpp"

namespace {

dtrain::RunOptions parse(std::vector<std::string> args) { return dtrain::parse_run_options(args); }

void check_rejected(std::vector<std::string> args, const std::string& needle) {
  BOOST_TEST_CONTEXT("args starting " << args.front()) {
    BOOST_CHECK_EXCEPTION(parse(args), dtrain::launch_error, [&](const dtrain::launch_error& e) {
      return e.problem().find(needle) != std::string::npos && !e.fix().empty();
    });
  }
}

std::string value_of(const std::vector<std::string>& env, const std::string& name) {
  std::string found;
  int count = 0;
  for (const auto& entry : env)
    if (entry.rfind(name + "=", 0) == 0) {
      found = entry.substr(name.size() + 1);
      ++count;
    }
  BOOST_TEST(count == 1, name << " appears " << count << " times");
  return found;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(launcher_options)

BOOST_AUTO_TEST_CASE(defaults) {
  auto o = parse({"./train", "--lr", "3"});
  BOOST_TEST((o.nproc.kind == dtrain::NprocSpec::Kind::count));
  BOOST_TEST(o.nproc.count == 1);
  BOOST_TEST(o.nnodes == 1);
  BOOST_TEST(o.node_rank == 0);
  BOOST_TEST(o.effective_master_addr() == "127.0.0.1");
  BOOST_TEST(!o.master_port.has_value());
  BOOST_TEST(o.max_restarts == 0);
  BOOST_TEST(o.prefix);
  BOOST_TEST(o.grace_period_s == 5.0);
  BOOST_TEST(o.program == "./train");
  // Everything after PROGRAM belongs to it, flags that look like ours too.
  BOOST_TEST(o.program_args == (std::vector<std::string>{"--lr", "3"}));
}

BOOST_AUTO_TEST_CASE(every_flag_in_both_spellings) {
  auto o = parse({"--nproc-per-node", "4", "--nnodes=3", "--node_rank", "2", "--master-addr", "10.1.1.1",
                  "--master_port=4242", "--max-restarts", "2", "--no-prefix", "--grace_period", "0.25", "prog",
                  "--nnodes", "9"});
  BOOST_TEST(o.nproc.count == 4);
  BOOST_TEST(o.nnodes == 3);
  BOOST_TEST(o.node_rank == 2);
  BOOST_TEST(o.effective_master_addr() == "10.1.1.1");
  BOOST_TEST(*o.master_port == 4242);
  BOOST_TEST(o.max_restarts == 2);
  BOOST_TEST(!o.prefix);
  BOOST_TEST(o.grace_period_s == 0.25);
  BOOST_TEST(o.program_args == (std::vector<std::string>{"--nnodes", "9"}));

  BOOST_TEST((parse({"--nproc_per_node=gpu", "p"}).nproc.kind == dtrain::NprocSpec::Kind::gpu));
  BOOST_TEST((parse({"--nproc-per-node", "auto", "p"}).nproc.kind == dtrain::NprocSpec::Kind::automatic));
  BOOST_TEST(parse({"--no-prefix", "--prefix", "p"}).prefix);
  BOOST_TEST(parse({"--", "--weird-program-name"}).program == "--weird-program-name");
  BOOST_TEST(*parse({"--master-port", "0", "p"}).master_port == 0);
  BOOST_TEST(parse({"--help"}).help);
  BOOST_TEST(parse({"-h"}).help);
  BOOST_TEST(parse({"--version"}).version);
}

BOOST_AUTO_TEST_CASE(bad_flags) {
  check_rejected({"--bogus", "p"}, "unknown option --bogus");
  // "-=x" is an option named "-" (it read past the name before; found by fuzzing).
  check_rejected({"-=node_rank", "p"}, "unknown option -=node_rank");
  check_rejected({"--nproc-per-node", "0", "p"}, "--nproc-per-node 0");
  check_rejected({"--nproc-per-node", "many", "p"}, "--nproc-per-node many");
  check_rejected({"--nproc-per-node"}, "needs a value");
  check_rejected({"--nnodes", "0", "p"}, "--nnodes 0");
  check_rejected({"--nnodes", "1:4", "p"}, "elastic");
  check_rejected({"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "p"}, "--node-rank 2");
  check_rejected({"--node-rank", "-1", "p"}, "--node-rank -1");
  check_rejected({"--nnodes", "2", "--node-rank", "1", "p"}, "needs --master-addr");
  check_rejected({"--nnodes", "2", "--master-addr", "h", "--master-port", "0", "p"}, "one node only");
  check_rejected({"--master-port", "65536", "p"}, "--master-port 65536");
  check_rejected({"--master-port", "http", "p"}, "--master-port http");
  check_rejected({"--master-addr=", "p"}, "--master-addr is empty");
  check_rejected({"--max-restarts", "-1", "p"}, "--max-restarts -1");
  check_rejected({"--grace-period", "-1", "p"}, "--grace-period -1");
  check_rejected({"--grace-period", "soon", "p"}, "--grace-period soon");
  check_rejected({"--prefix=yes", "p"}, "takes no value");
  check_rejected({"--nproc-per-node", "2"}, "no PROGRAM");
  // torchrun's flags that have no meaning here say what to do instead.
  check_rejected({"--nnodes", "1:2", "p"}, "--nnodes 1:2: elastic MIN:MAX node counts are not supported");
  check_rejected({"--nnodes", "2:x", "p"}, "--nnodes 2:x");
  check_rejected({"-m", "pkg.train"}, "dtrain-run runs programs, not Python modules");
  check_rejected({"--module", "pkg.train"}, "dtrain-run runs programs, not Python modules");
  check_rejected({"--run_path", "t.py"}, "not Python files");
  check_rejected({"--rdzv_backend", "etcd", "p"}, "--rdzv-backend etcd is not supported");
  check_rejected({"--rdzv_conf", "timeout=9", "p"}, "--rdzv-conf is not supported");
  check_rejected({"--local_ranks_filter", "0", "p"}, "--local-ranks-filter is not supported");
  check_rejected({"--rdzv-endpoint", ":29400", "p"}, "names no host");
  check_rejected({"--rdzv-endpoint", "h:x", "p"}, "port");
  check_rejected({"--rdzv-endpoint", "h", "p"}, "has no port");  // static needs one
  check_rejected({"--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--nnodes", "2", "p"}, "needs --node-rank");
  check_rejected({"--standalone", "--nnodes", "2", "p"}, "--standalone runs one node");
  check_rejected({"--standalone=1", "p"}, "takes no value");
  check_rejected({"--redirects", "4", "p"}, "--redirects 4");
  check_rejected({"--tee", "0:1,x", "p"}, "--tee 0:1,x");
  check_rejected({"--log-dir=", "p"}, "--log-dir is empty");
  check_rejected({"--monitor-interval", "-1", "p"}, "--monitor-interval -1");
  check_rejected({"--start-method", "thread", "p"}, "--start-method thread");
}

BOOST_AUTO_TEST_CASE(more_nodes_than_the_slurm_job_has_are_refused) {
  const auto two = parse({"--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "p"});
  auto env_of = [](std::map<std::string, std::string> vars) -> dtrain::EnvLookup {
    return [vars](const std::string& name) -> std::optional<std::string> {
      auto it = vars.find(name);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  BOOST_CHECK_EXCEPTION(dtrain::check_slurm_nodes(two, env_of({{"SLURM_JOB_NUM_NODES", "1"}})), dtrain::launch_error,
                        [](const dtrain::launch_error& e) {
                          return e.problem().find("--nnodes 2, but this Slurm job has 1 node(s)") !=
                                     std::string::npos &&
                                 e.fix().find("--nnodes 1") != std::string::npos;
                        });
  BOOST_CHECK_THROW(dtrain::check_slurm_nodes(two, env_of({{"SLURM_NNODES", "1"}})), dtrain::launch_error);
  // Enough nodes, no Slurm, or one node: nothing to say.
  BOOST_CHECK_NO_THROW(dtrain::check_slurm_nodes(two, env_of({{"SLURM_JOB_NUM_NODES", "2"}})));
  BOOST_CHECK_NO_THROW(dtrain::check_slurm_nodes(two, env_of({})));
  BOOST_CHECK_NO_THROW(dtrain::check_slurm_nodes(parse({"p"}), env_of({{"SLURM_JOB_NUM_NODES", "1"}})));
}

// The Kubernetes Job the docs show (examples/k8s/job.yaml), checked for
// what can be checked without a cluster: dtrain-run's parser takes its
// command, the grace periods nest, the ignored exit code is fit's
// preemption code, and the restart policy is the one a pod failure policy
// needs.
BOOST_AUTO_TEST_CASE(the_kubernetes_job_fits_dtrain_run) {
  const YAML::Node job = YAML::LoadFile(std::string(DTRAIN_SOURCE_DIR) + "/examples/k8s/job.yaml");
  BOOST_TEST(job["kind"].as<std::string>() == "Job");
  const YAML::Node pod = job["spec"]["template"]["spec"];
  BOOST_TEST(pod["restartPolicy"].as<std::string>() == "Never");
  bool ignores_preemption = false;
  for (const auto& rule : job["spec"]["podFailurePolicy"]["rules"]) {
    if (rule["action"].as<std::string>() != "Ignore" || rule["onExitCodes"]["operator"].as<std::string>() != "In")
      continue;
    for (const auto& code : rule["onExitCodes"]["values"])
      ignores_preemption |= code.as<int>() == dtrain::preempted_exit_code;
  }
  BOOST_TEST(ignores_preemption, "no Ignore rule for exit code " << dtrain::preempted_exit_code);
  const auto command = pod["containers"][0]["command"].as<std::vector<std::string>>();
  BOOST_TEST_REQUIRE(command.size() > 1);
  BOOST_TEST(command[0] == "dtrain-run");
  const auto opts = parse(std::vector<std::string>(command.begin() + 1, command.end()));
  BOOST_TEST(opts.grace_period_s < pod["terminationGracePeriodSeconds"].as<double>());
  BOOST_TEST((opts.nproc.kind == dtrain::NprocSpec::Kind::gpu));
  BOOST_TEST(
      (std::find(opts.program_args.begin(), opts.program_args.end(), "resume=latest") != opts.program_args.end()));
  BOOST_TEST((std::count_if(opts.program_args.begin(), opts.program_args.end(),
                            [](const std::string& a) { return a.rfind("checkpoint_dir=", 0) == 0; }) == 1));
}

BOOST_AUTO_TEST_CASE(usage_documents_every_flag) {
  auto usage = dtrain::run_usage();
  for (const char* flag : {"--nproc-per-node",
                           "--nnodes",
                           "--node-rank",
                           "--master-addr",
                           "--master-port",
                           "--max-restarts",
                           "--prefix",
                           "--no-prefix",
                           "--grace-period",
                           "--help",
                           "--version",
                           "29500",
                           "127.0.0.1",
                           "--standalone",
                           "--rdzv-backend",
                           "--rdzv-endpoint",
                           "--rdzv-id",
                           "--log-dir",
                           "--redirects",
                           "--tee",
                           "--no-python",
                           "--monitor-interval",
                           "--start-method",
                           "-m/--module",
                           "--run-path",
                           "TORCHELASTIC_RUN_ID",
                           "DTRAIN_LAUNCH_DEVICE"})
    BOOST_TEST(usage.find(flag) != std::string::npos, flag);
}

// torchrun's flags, as its users write them, mean what they mean there.
BOOST_AUTO_TEST_CASE(torchrun_flags) {
  auto standalone =
      parse({"--standalone", "--nproc_per_node", "2", "--master_port", "1234", "--rdzv_id", "x", "--no_python", "p"});
  BOOST_TEST(standalone.nnodes == 1);
  BOOST_TEST(standalone.effective_master_addr() == "127.0.0.1");
  BOOST_TEST(*standalone.master_port == 0);  // 0: a free port, whatever else was asked
  BOOST_TEST(standalone.rdzv_id.size() == 32u);
  BOOST_TEST(parse({"--standalone", "p"}).rdzv_id != standalone.rdzv_id);

  auto c10d = parse({"--rdzv_backend=c10d", "--rdzv_endpoint", "node0:4321", "--rdzv_id", "job1", "--nnodes", "2:2",
                     "--node_rank", "1", "p"});
  BOOST_TEST(c10d.nnodes == 2);
  BOOST_TEST(c10d.effective_master_addr() == "node0");
  BOOST_TEST(*c10d.master_port == 4321);
  BOOST_TEST(c10d.rdzv_id == "job1");
  // torchrun's c10d port when the endpoint has none; brackets around IPv6.
  BOOST_TEST(*parse({"--rdzv-backend", "c10d", "--rdzv-endpoint", "h", "p"}).master_port == 29400);
  auto v6 = parse({"--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]:77", "p"});
  BOOST_TEST(v6.effective_master_addr() == "::1");
  BOOST_TEST(*v6.master_port == 77);
  // static with an endpoint: it replaces --master-addr/--master-port, as in torchrun.
  auto fixed = parse({"--master-addr", "a", "--master-port", "1", "--rdzv-endpoint", "b:2", "p"});
  BOOST_TEST(fixed.effective_master_addr() == "b");
  BOOST_TEST(*fixed.master_port == 2);

  auto logs = parse(
      {"--log_dir", "L", "-r", "3", "--tee=0:1,2:2", "--monitor_interval", "0.5", "--start_method", "spawn", "p"});
  BOOST_TEST(*logs.log_dir == "L");
  BOOST_TEST(logs.redirects.of(5) == 3);
  BOOST_TEST(logs.tee.of(0) == 1);
  BOOST_TEST(logs.tee.of(1) == 0);
  BOOST_TEST(logs.tee.of(2) == 2);
  BOOST_TEST((parse({"--nproc-per-node", "cpu", "p"}).nproc.kind == dtrain::NprocSpec::Kind::cpu));
}

// --tee is --redirects plus the console; either alone leaves the console.
BOOST_AUTO_TEST_CASE(stream_routes) {
  using S = dtrain::StdStreams;
  auto o = parse({"--redirects", "0:3,1:1", "--tee", "1:2", "p"});
  auto route = [&](int local, int stream) {
    auto r = dtrain::stream_route(o, local, stream);
    return std::string(r.file ? "file" : "") + (r.console ? "console" : "");
  };
  BOOST_TEST(route(0, S::out) == "file");
  BOOST_TEST(route(0, S::err) == "file");
  BOOST_TEST(route(1, S::out) == "file");
  BOOST_TEST(route(1, S::err) == "fileconsole");
  BOOST_TEST(route(2, S::out) == "console");
  BOOST_TEST(dtrain::logs_to_files(o));
  BOOST_TEST(!dtrain::logs_to_files(parse({"--log-dir", "L", "--redirects", "0", "--tee", "0:0", "p"})));
  BOOST_TEST(dtrain::rank_log_file("R", 2, 1, S::err).string() == "R/attempt_2/1/stderr.log");
}

BOOST_AUTO_TEST_CASE(nproc_resolution) {
  using K = dtrain::NprocSpec::Kind;
  BOOST_TEST(dtrain::resolve_nproc({K::count, 3}, 8, 64) == 3);
  BOOST_TEST(dtrain::resolve_nproc({K::gpu, 0}, 8, 64) == 8);
  BOOST_CHECK_THROW(dtrain::resolve_nproc({K::gpu, 0}, 0, 64), dtrain::launch_error);
  BOOST_TEST(dtrain::resolve_nproc({K::automatic, 0}, 2, 64) == 2);
  BOOST_TEST(dtrain::resolve_nproc({K::automatic, 0}, 0, 6) == 6);
  BOOST_TEST(dtrain::resolve_nproc({K::cpu, 0}, 8, 6) == 6);
  // No GPU: the fix names the CPU alternative.
  BOOST_CHECK_EXCEPTION(
      dtrain::resolve_nproc({K::gpu, 0}, 0, 64), dtrain::launch_error,
      [](const dtrain::launch_error& e) { return e.fix().find("--nproc-per-node N") != std::string::npos; });
}

BOOST_AUTO_TEST_CASE(host_facts) {
  BOOST_TEST(dtrain::cuda_device_count() >= 0);
  BOOST_TEST(dtrain::usable_cpu_count() >= 1);
  int port = dtrain::free_tcp_port();
  BOOST_TEST(port >= 1);
  BOOST_TEST(port <= 65535);
  // The port really is free: we can listen on it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  BOOST_TEST(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  ::close(fd);
}

// The token a launch gives its ranks: the environment's, a fresh one on one
// node, an error on several nodes without one, none only when asked.
BOOST_AUTO_TEST_CASE(job_token_for_a_launch) {
  using Env = std::map<std::string, std::string>;
  const auto lookup = [](const Env& env) {
    return dtrain::EnvLookup([env](const std::string& name) -> std::optional<std::string> {
      const auto it = env.find(name);
      return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
    });
  };
  const auto one = parse({"p"});
  const auto two = parse({"--nnodes", "2", "--master-addr", "n0", "p"});
  const std::string given(40, 'k');
  BOOST_TEST(dtrain::job_token_for(two, lookup({{"DTRAIN_JOB_TOKEN", given}})) == given);
  const auto fresh = dtrain::job_token_for(one, lookup({}));
  BOOST_TEST(fresh.size() == 64u);
  BOOST_TEST(fresh.find_first_not_of("0123456789abcdef") == std::string::npos);
  BOOST_TEST(dtrain::job_token_for(one, lookup({})) != fresh);  // random, per launch
  BOOST_TEST(dtrain::job_token_for(two, lookup({{"DTRAIN_INSECURE_NO_TOKEN", "1"}})).empty());
  BOOST_CHECK_EXCEPTION(dtrain::job_token_for(two, lookup({})), dtrain::launch_error, [](const dtrain::error& e) {
    return std::string(e.what()).find("needs one job token on every node") != std::string::npos &&
           std::string(e.what()).find("dtrain-run --new-token") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(dtrain::job_token_for(one, lookup({{"DTRAIN_JOB_TOKEN", "short"}})), dtrain::config_error,
                        [](const dtrain::error& e) {
                          return std::string(e.what()).find("DTRAIN_JOB_TOKEN has 5 characters") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(rank_environment) {
  auto o = parse({"--nnodes", "2", "--node-rank", "1", "--master-addr", "n0", "p"});
  dtrain::GroupLayout g{.nproc_per_node = 3,
                        .master_port = 777,
                        .cpu_count = 8,
                        .restart_count = 2,
                        .job_id = "r42x2",
                        .log_dir = "",
                        .error_dir = "/run/job",
                        .job_token = "a-job-token-of-thirty-two-characters"};
  std::vector<std::string> inherited{"PATH=/bin",         "RANK=99",         "DTRAIN_JOB_TOKEN=inherited-but-replaced",
                                     "OMP_NUM_THREADS=5", "MASTER_ADDR=old", "TORCHELASTIC_ERROR_FILE=/outer.json"};
  auto env = dtrain::rank_environment(o, g, 2, inherited);
  BOOST_TEST(value_of(env, "PATH") == "/bin");
  BOOST_TEST(value_of(env, "RANK") == "5");
  BOOST_TEST(value_of(env, "WORLD_SIZE") == "6");
  BOOST_TEST(value_of(env, "DTRAIN_JOB_ID") == "r42x2");
  BOOST_TEST(value_of(env, "DTRAIN_JOB_TOKEN") == "a-job-token-of-thirty-two-characters");
  BOOST_TEST(value_of(env, "LOCAL_RANK") == "2");
  BOOST_TEST(value_of(env, "LOCAL_WORLD_SIZE") == "3");
  BOOST_TEST(value_of(env, "GROUP_RANK") == "1");
  BOOST_TEST(value_of(env, "MASTER_ADDR") == "n0");
  BOOST_TEST(value_of(env, "MASTER_PORT") == "777");
  BOOST_TEST(value_of(env, "DTRAIN_RUN") == "1");
  BOOST_TEST(value_of(env, "DTRAIN_RESTART_COUNT") == "2");
  BOOST_TEST(value_of(env, "OMP_NUM_THREADS") == "5");       // the user's choice stays
  BOOST_TEST(value_of(env, "OPENBLAS_NUM_THREADS") == "2");  // 8 cores / 3 ranks

  BOOST_TEST(value_of(env, "TORCHELASTIC_RUN_ID") == "none");                                 // torchrun's default
  BOOST_TEST(value_of(env, "TORCHELASTIC_ERROR_FILE") == "/run/job/attempt_2/2/error.json");  // one per rank

  g.cpu_count = 2;
  auto crowded = dtrain::rank_environment(o, g, 0, {});
  BOOST_TEST(value_of(crowded, "OMP_NUM_THREADS") == "1");  // never 0
}

// DTRAIN_LAUNCH_DEVICE says "gpu" only for --nproc-per-node gpu; what the
// launcher's own launcher set (torchrun's agent store, a gpu launch) is
// dropped, as it is not true of this launch.
BOOST_AUTO_TEST_CASE(launch_device_and_run_id) {
  dtrain::GroupLayout g{.nproc_per_node = 2,
                        .master_port = 777,
                        .cpu_count = 8,
                        .restart_count = 0,
                        .job_id = "j",
                        .log_dir = "",
                        .error_dir = ""};
  std::vector<std::string> inherited{"DTRAIN_LAUNCH_DEVICE=gpu", "TORCHELASTIC_USE_AGENT_STORE=True",
                                     "TORCHELASTIC_RUN_ID=outer", "TORCHELASTIC_ERROR_FILE=/outer.json"};
  auto gpu = dtrain::rank_environment(parse({"--nproc-per-node", "gpu", "--rdzv-id", "job1", "p"}), g, 0, inherited);
  BOOST_TEST(value_of(gpu, "DTRAIN_LAUNCH_DEVICE") == "gpu");
  BOOST_TEST(value_of(gpu, "TORCHELASTIC_RUN_ID") == "job1");
  for (const auto& o : {parse({"--nproc-per-node", "2", "p"}), parse({"--nproc-per-node", "auto", "p"})}) {
    auto env = dtrain::rank_environment(o, g, 1, inherited);
    for (const auto& entry : env) {
      BOOST_TEST(entry.rfind("DTRAIN_LAUNCH_DEVICE=", 0) != 0u, entry);
      BOOST_TEST(entry.rfind("TORCHELASTIC_USE_AGENT_STORE=", 0) != 0u, entry);
      BOOST_TEST(entry.rfind("TORCHELASTIC_ERROR_FILE=", 0) != 0u, entry);  // no folder: no records
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// A failure recorded for the launcher reads back as written: quotes,
// backslashes, new lines and other control characters in the message, the
// exit code and when the error was raised; nothing is written without the
// variable, and a record without dtrain's fields (torchrun's own) is not one.
BOOST_AUTO_TEST_CASE(error_records_read_back) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dtrain_records_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "error.json";
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  dtrain::record_failure(dtrain::config_error("nothing to write"));
  BOOST_TEST(!std::filesystem::exists(file));

  ::setenv("TORCHELASTIC_ERROR_FILE", file.c_str(), 1);
  const dtrain::config_error e("a \"quoted\" C:\\path\twith a tab", "fix it");
  dtrain::record_failure(e);
  auto r = dtrain::read_error_record(file);
  BOOST_REQUIRE(r.has_value());
  BOOST_TEST(r->message.rfind("a \"quoted\" C:\\path\twith a tab\n  fix: fix it\n  at: ", 0) == 0u, r->message);
  BOOST_TEST(r->exit_code == 2);
  BOOST_TEST(r->raised_at_us == e.raised_at_us());
  BOOST_TEST(e.raised_at_us() > 1'700'000'000'000'000);  // microseconds since 1970, after 2023

  dtrain::record_failure(std::runtime_error("not dtrain's"), 7);  // replaces the record; raised now
  r = dtrain::read_error_record(file);
  BOOST_REQUIRE(r.has_value());
  BOOST_TEST(r->message == "not dtrain's");
  BOOST_TEST(r->exit_code == 7);
  BOOST_TEST(r->raised_at_us >= e.raised_at_us());
  ::unsetenv("TORCHELASTIC_ERROR_FILE");

  std::ofstream(file) << R"({"message": {"message": "from Python", "extraInfo": {"timestamp": "1700000000"}}})";
  BOOST_TEST(!dtrain::read_error_record(file).has_value());
  BOOST_TEST(!dtrain::read_error_record(dir / "missing.json").has_value());
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE(line_prefixer)

BOOST_AUTO_TEST_CASE(whole_lines_only) {
  dtrain::LinePrefixer p("[rank 3] ");
  BOOST_TEST(p.feed("hel") == "");
  BOOST_TEST(p.feed("lo\nwor") == "[rank 3] hello\n");
  BOOST_TEST(p.feed("ld\n\nnext\nta") == "[rank 3] world\n[rank 3] \n[rank 3] next\n");
  BOOST_TEST(p.finish() == "[rank 3] ta\n");
  BOOST_TEST(p.finish() == "");
}

BOOST_AUTO_TEST_CASE(long_lines_are_split) {
  dtrain::LinePrefixer p("> ", 4);
  BOOST_TEST(p.feed("abcdefghij") == "> abcd\n> efgh\n");
  BOOST_TEST(p.feed("k\n") == "> ijk\n");
  BOOST_TEST(p.finish() == "");
}

BOOST_AUTO_TEST_SUITE_END()
