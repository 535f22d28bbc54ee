// dsv4 bench: prefill and batched decode throughput of a model on a backend, against the HBM floor
// (bench/e2e/bench_e2e.h); optionally on a checkpoint synthesised for the run (loader/synth.h).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "e2e/bench_e2e.h"
#include "e2e/bench_plot.h"
#include "engine/backend.h"
#include "model_options.h"
#include "loader/synth.h"

namespace dsv4::cli {

namespace {

constexpr const char* kHelp = R"(usage: dsv4 bench [--model DIR | --synth PRESET --layers N] [options]

Prefill throughput, and decode latency / throughput of batches of sequences at given context depths, each
decode row with its floor: the bytes the step must move (every dense matrix, the routed experts a batch of
that size is expected to select, the KV cache the step reads) over the measured copy bandwidth of the device.
Markdown on stdout, progress on stderr.

  --model DIR          checkpoint directory (default: the tiny model shipped in models/tiny)
  --synth PRESET       benchmark a random checkpoint of v4-flash / v4-pro shapes made in memory, no file: on
                       cuda each GPU makes its own shard of the matrices in place (a full V4-Flash needs
                       0.15 GiB of host memory); on cpu the host holds all of it
    --layers N         its first N layers (default: all)
    --no-mtp           without the MTP module (decode does not run it; loaded by default, as served)
    --synth-dir DIR    write it there as files instead (kept) and benchmark those
    --experts N, --vocab N, --dim N, --inter N, --set F=V,...   smaller dims, as for dsv4 synth
    --synth-seed N     seed of the weights (default 0)
  --backend NAME       auto (default: cuda when available), cpu or cuda
  --numerics MODE      auto (default: fast on cuda, reference on cpu) | fast | reference | exact
  --tp N, --ep N       split the model over N ranks (GPUs 0..N−1 on cuda), as for dsv4 generate; the decode
                       floor is then the checkpoint's bytes over N GPUs' bandwidth
  --prefill LIST       prompt lengths (default 512,4096)
  --contexts LIST      context depths for decode (default 0,4096,32768)
  --batches LIST       sequences per decode step (default 1,8,64)
  --reps N             repetitions of every measurement (default 3)
  --decode-steps N     timed decode steps per repetition (default 16)
  --step N             prefill tokens per forward step (default as the model commands': 2048 on cuda, 64 on
                       cpu)
  --logits             decode steps download every sequence's logits (as a host sampler needs them) instead
                       of the greedy next tokens chosen on the backend (as generate --temperature 0 runs)
  --temperature T      decode steps draw every sequence's next token at temperature T on the backend (as
                       generate and serve sample) instead of the greedy one
  --seed N             seed of the random tokens
  --json FILE          also write the results as JSON
  --plot FILE.svg      also draw them: every decode row's ms per step against its floor, grouped by context
                       (log scale, the percentage of the floor above each bar), and prefill tokens/s
)";

std::vector<int64_t> list(const Args& args, const char* name, std::vector<int64_t> fallback) {
  if (!args.has(name)) return fallback;
  std::vector<int64_t> out;
  for (int32_t v : args.get_ids(name)) out.push_back(v);
  return out;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const Args args(argc, argv, 2,
                  {"--model", "--synth", "--layers", "--synth-dir", "--synth-seed", "--experts", "--vocab", "--dim",
                   "--inter", "--set", "--backend", "--numerics", "--prefill", "--contexts", "--batches", "--reps", "--decode-steps",
                   "--step", "--seed", "--json", "--plot", "--tp", "--ep", "--temperature"},
                  {"--logits", "--no-mtp"});
  check_synth_only(args, {"--synth-dir", "--no-mtp"});
  const int64_t seed = args.get_int("--seed", 0);
  DSV4_CHECK(seed >= 0, "--seed must not be negative");

  BenchOptions o;
  o.backend = args.get("--backend", "auto");
  o.parallelism = parallelism_option(args);
  o.numerics = parse_numerics(args.get("--numerics", "auto"), resolve_backend_name(o.backend));
  o.prefill = list(args, "--prefill", o.prefill);
  o.contexts = list(args, "--contexts", o.contexts);
  o.batches = list(args, "--batches", o.batches);
  o.reps = args.get_int("--reps", o.reps);
  o.decode_steps = args.get_int("--decode-steps", o.decode_steps);
  o.step = args.get_int("--step", default_step(resolve_backend_name(o.backend)));
  o.download_logits = args.has("--logits");
  o.temperature = float(args.get_double("--temperature", 0.0));
  DSV4_CHECK(std::isfinite(o.temperature) && o.temperature >= 0.0f, "--temperature must be >= 0");
  DSV4_CHECK(!(o.download_logits && o.temperature > 0.0f), "--logits and --temperature exclude each other");
  o.seed = uint64_t(seed);
  o.log = [](const std::string& line) { std::fprintf(stderr, "bench: %s\n", line.c_str()); };
  // Fail on an unwritable --json or --plot before the (possibly long) run.
  for (const char* output : {"--json", "--plot"}) {
    if (!args.has(output)) continue;
    std::ofstream probe(args.get(output), std::ios::app);
    DSV4_CHECK(probe.good(), args.get(output), ": cannot write");
  }

  SynthResult synth;
  if (args.has("--synth")) {
    SynthOptions s = synth_options(args);
    s.mtp = !args.has("--no-mtp");
    if (args.has("--synth-dir")) {
      o.model_dir = args.get("--synth-dir");
      synth = synth_checkpoint(s, o.model_dir);
      char line[512];
      std::snprintf(line, sizeof line, "synthesised %s (%lld layers) in %s: %.2f GiB in %.1f s (%.2f GB/s)",
                    s.preset.c_str(), (long long)synth.config.n_layers, o.model_dir.c_str(),
                    double(synth.bytes) / (1 << 30), synth.seconds,
                    double(synth.bytes) / std::max(synth.seconds, 1e-9) / 1e9);
      o.log(line);
    } else {
      o.model_dir = cat("synth ", s.preset, " (in memory)");
      const SynthPlace place = resolve_backend_name(o.backend) == "cuda" ? SynthPlace::kDevice : SynthPlace::kHost;
      o.load = [s, place, &synth] { return synth_model(s, place, &synth); };
    }
  } else {
    o.model_dir = model_dir(args);
  }

  BenchReport report = run_bench(o);
  if (args.has("--synth"))
    report.synth = {{"preset", args.get("--synth")}, {"layers", synth.config.n_layers}, {"bytes", synth.bytes},
                    {"host_bytes", synth.host_bytes}, {"seconds", synth.seconds},
                    {"in_memory", !args.has("--synth-dir")}};
  const std::string md = bench_markdown(report);
  std::fwrite(md.data(), 1, md.size(), stdout);
  const auto write = [&](const char* output, const std::string& text) {
    if (!args.has(output)) return;
    std::ofstream out(args.get(output), std::ios::trunc);
    out << text;
    DSV4_CHECK(out.good(), args.get(output), ": write failed");
  };
  write("--json", bench_json(report).dump(2) + "\n");
  write("--plot", bench_svg(report));
  return 0;
}

}  // namespace dsv4::cli
