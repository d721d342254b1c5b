// Registration of the `shoal` subcommands. Each add_* function attaches its subcommands to
// the app with a callback; the callback records the process exit code.
#pragma once

#include <expected>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include <cstdint>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace shoal::model {
enum class kv_dtype : uint8_t;
}

namespace shoal::sim {
struct sim_config;
}

namespace shoal::tools {

void add_model_commands(CLI::App& app);     // mkmodel, logits
void add_generate_command(CLI::App& app);   // generate
void add_bench_commands(CLI::App& app);     // bench …
void add_engine_bench(CLI::App& bench);     // bench engine
void add_model_benches(CLI::App& bench);    // bench fit-cost, bench replay
void add_shell_command(CLI::App& app);      // shell
void add_serve_bench(CLI::App& bench);      // bench serve
void add_storage_bench(CLI::App& bench);    // bench storage
void add_kv_trace_bench(CLI::App& bench);   // bench kv-trace
void add_transport_bench(CLI::App& bench);  // bench transport
void add_disagg_bench(CLI::App& bench);     // bench disagg
void add_swa_bench(CLI::App& bench);        // bench swa
void add_vision_bench(CLI::App& bench);     // bench vision
void add_ep_frames_bench(CLI::App& bench);  // bench ep-frames
void add_grammar_bench(CLI::App& bench);    // bench grammar
void add_eplb_bench(CLI::App& bench);       // bench eplb, bench ep-memory
void add_ep_migration_bench(CLI::App& bench);  // bench ep-migration
void add_spec_bench(CLI::App& bench);       // bench spec
void add_cluster_commands(CLI::App& app);   // up, down
void add_sim_command(CLI::App& app);        // sim
void add_cluster_bench(CLI::App& bench);    // bench cluster
void add_ep_fault_bench(CLI::App& bench);   // bench ep-fault
// The shape of the cluster a node-config directory describes, as `shoal bench cluster`
// simulates it (bench_cluster.cpp): ranks, EP groups, engine processes, DSpark depths and the
// engines' scheduler limits into `c` (its profile's pools). Errors name the file.
std::expected<void, std::string> sim_shape_from_config(const std::string& dir, sim::sim_config& c);
// A copy of the node configs of `dir` beside it (".bench-cluster-<name>", made anew; relative
// paths keep resolving), each file's text passed through `edit`, with the storage tier's
// directory inside the copy, so a benchmark run starts with an empty tier.
std::expected<std::filesystem::path, std::string> fresh_config_copy(const std::filesystem::path& dir,
                                                                   const std::function<void(std::string&)>& edit);
// `shoal up` / `shoal down` (cluster_commands.cpp): exit codes.
int cluster_up(const std::filesystem::path& config, const std::filesystem::path& state_dir, int timeout_s);
int cluster_down(const std::filesystem::path& state_dir, int timeout_s);
// The pids `shoal up` recorded in `state_dir`, by node name.
std::map<std::string, int> cluster_pids(const std::filesystem::path& state_dir);
// `shoal up --node NAME`: starts that node of `config` in the running cluster of `state_dir`
// (a restart after it died; refused while it runs), and records its pid for `shoal down`.
int cluster_start_node(const std::filesystem::path& config, const std::filesystem::path& state_dir,
                       const std::string& name, int timeout_s);
// The node a shell reaches the cluster that `shoal up --state-dir DIR` started through
// ("HOST:PORT", recorded in DIR/cluster.connect); empty when DIR records no running cluster.
std::string recorded_cluster(const std::filesystem::path& state_dir);
// The whole file as bytes; empty when it cannot be read.
std::string read_text(const std::filesystem::path& p);
// `--kv-dtype fp32 | bf16 | fp8`: the paged KV cache's stored form, into `out` (which must
// outlive the parse); anything else is refused by the parser, naming the choices.
CLI::Option* add_kv_dtype_option(CLI::App& app, model::kv_dtype& out, const std::string& help);
int exit_code();
void set_exit_code(int code);

}  // namespace shoal::tools
