// dsv4 synth: a random checkpoint with V4-Flash / V4-Pro shapes and official storage formats (synth.h).
#include <unistd.h>

#include <cstdio>

#include "args.h"
#include "commands.h"
#include "core/error.h"
#include "loader/synth.h"

namespace dsv4::cli {

namespace {

constexpr const char* kHelp = R"(usage: dsv4 synth --preset v4-flash|v4-pro --out DIR [options]

Writes a random checkpoint with the preset's exact shapes, official tensor names and official storage formats
(FP8 e4m3 + E8M0 128x128 block scales, FP4 e2m1 + E8M0 per-32 scales for routed experts, BF16 / F32 / I64
elsewhere), sharded one file per layer with model.safetensors.index.json, plus config.json in the official
spelling. Values are scaled like an initialised model, so the forward pass gives finite logits and varied
routing. The same seed gives the same bytes.

  --preset NAME     v4-flash (43 layers, ~3.5 GB per layer) or v4-pro (61 layers)
  --out DIR         output directory (created; must not already hold a checkpoint unless --force)
  --layers N        the first N layers of the preset's schedule (default: all)
  --mtp / --no-mtp  write the MTP module mtp.0.* (default: on)
  --seed N          random seed (default 0)
  --force           overwrite the checkpoint files of DIR
  --dry-run         print the tensor count and size, write nothing (--out not needed)
Smaller models of the same layout (tests):
  --experts N       n_routed_experts
  --vocab N         vocab_size
  --dim N           hidden_size (a multiple of 32)
  --inter N         moe_intermediate_size (a multiple of 32)
  --set F=V,...     any other numeric config.json field, e.g. --set num_attention_heads=4,q_lora_rank=64
)";

}  // namespace

int cmd_synth(int argc, char** argv) {
  if (wants_help(argc, argv)) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const Args args(argc, argv, 2,
                  {"--preset", "--out", "--layers", "--seed", "--experts", "--vocab", "--dim", "--inter", "--set"},
                  {"--mtp", "--no-mtp", "--force", "--dry-run"});
  DSV4_CHECK(!(args.has("--mtp") && args.has("--no-mtp")), "give at most one of --mtp and --no-mtp");
  SynthOptions o;
  o.preset = args.get("--preset");
  o.dry_run = args.has("--dry-run");
  const std::string out = o.dry_run ? args.get("--out", "") : args.get("--out");
  o.layers = args.get_int("--layers", 0);
  DSV4_CHECK(!args.has("--layers") || o.layers >= 1, "--layers must be at least 1");
  o.mtp = !args.has("--no-mtp");
  const int64_t seed = args.get_int("--seed", 0);
  DSV4_CHECK(seed >= 0, "--seed must not be negative");
  o.seed = uint64_t(seed);
  o.force = args.has("--force");
  for (const std::string& name : synth_override_options())
    if (args.has("--" + name)) add_synth_override(name, args.get("--" + name), &o);

  const bool tty = isatty(fileno(stderr));
  const SynthResult r = synth_checkpoint(o, out, [&](size_t done, size_t total) {
    if (tty) std::fprintf(stderr, "\rsynth %s: %.1f / %.1f GiB", out.c_str(), double(done) / (1 << 30), double(total) / (1 << 30));
  });
  if (o.dry_run) {
    std::printf("%s (%lld layers%s): %zu tensors, %.2f GiB (%.1f GB)\n", o.preset.c_str(), (long long)r.config.n_layers,
                o.mtp ? " + MTP" : "", r.tensors, double(r.bytes) / (1 << 30), double(r.bytes) / 1e9);
    return 0;
  }
  if (tty) std::fprintf(stderr, "\n");
  std::fprintf(stderr, "wrote %s (%lld layers%s): %zu tensors, %.2f GiB in %.1f s (%.2f GB/s) to %s\n", o.preset.c_str(),
               (long long)r.config.n_layers, o.mtp ? " + MTP" : "", r.tensors, double(r.bytes) / (1 << 30), r.seconds,
               r.seconds > 0 ? double(r.bytes) / r.seconds / 1e9 : 0.0, out.c_str());
  return 0;
}

}  // namespace dsv4::cli
